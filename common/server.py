"""The request loop every server runs, and the request/reply client.

A :class:`Server` owns a ROUTER socket: it decodes each message, dispatches
it by type to a handler, and replies. It never dies of a message: a message
that does not decode gets an ``error`` reply and is counted in
``rlfleet_protocol_errors_total``; a handler that raises :class:`RequestError`
answers with that error; any other exception is logged with its stack and the
loop goes on. Handlers may keep the :class:`Peer` and reply later (held
samples, long polls, barriers); :meth:`Server.tick` runs between messages
for timers.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from common.metrics import ServiceMetrics
from common.protocol import DEFAULT_LIMITS, Limits, Message, ProtocolError, decode, encode
from common.transport import DEFAULT_HWM, CommTimeout, CurveConfig, make_socket, recv, send

log = logging.getLogger(__name__)


class RequestError(Exception):
    """A well-formed request that cannot be served; becomes an ``error`` reply."""

    def __init__(self, reason: str, detail: str, *, count: bool = True) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.count = count  # counted in rlfleet_protocol_errors_total (not a service's own trouble)


class RemoteError(Exception):
    """The server answered a request with an ``error`` message."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Peer:
    """Where a reply goes: the ROUTER identity of the sender and its request seq."""

    identity: bytes
    seq: int
    sender: str = ""


Handler = Callable[[Peer, Message], None]

_NOBLOCK = int(zmq.NOBLOCK)  # plain ints: pyzmq's enum flags cost a Python call per use
_SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)


_SNDMORE = int(zmq.SNDMORE)
# the compiled send: pyzmq's Python-level Socket.send only adds the draft routing_id/group
# arguments, and costs ~0.6 us a frame
_send = zmq.backend.Socket.send


def send_parts(sock: zmq.Socket[Any], frames: Sequence[Any], flags: int = 0) -> None:
    """``send_multipart(frames, flags)`` at half the cost (plain int flags, pyzmq's compiled send).

    Every frame is copied into its ZeroMQ message, also large ones: without a copy ZeroMQ
    reads a buffer after this returns, possibly much later (a slow peer's queue), and a
    paramserver reply's arrays may be views of a shared-memory file that is reused for a
    later version once dropped. Small frames (the usual replies, inserts) cost less copied.
    """
    last = len(frames) - 1
    more = flags | _SNDMORE
    for i, frame in enumerate(frames):
        _send(sock, frame, more if i < last else flags, True)


def recv_frames(sock: zmq.Socket[Any]) -> list[zmq.Frame]:
    """One whole multipart message without waiting (zmq.Again if none is queued).

    The same as ``recv_multipart(NOBLOCK, copy=False)`` at half the cost:
    each Frame says whether more follow, so no RCVMORE query per frame.
    """
    frame = sock.recv(_NOBLOCK, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(_NOBLOCK, copy=False)
        frames.append(frame)
    return frames


class _Traffic:
    """Messages and bytes of one (type, direction) not yet added to the Prometheus counters."""

    __slots__ = ("messages", "bytes", "_messages", "_bytes")

    def __init__(self, metrics: ServiceMetrics, mtype: str, direction: str) -> None:
        self.messages = self.bytes = 0
        self._messages = metrics.messages.labels(mtype, direction)
        self._bytes = metrics.bytes.labels(mtype, direction)

    def flush(self) -> None:
        self._messages.inc(self.messages)
        self._bytes.inc(self.bytes)
        self.messages = self.bytes = 0


class Server:
    """A ROUTER request loop. Subclasses register handlers and override tick()."""

    #: longest the loop sleeps between ticks
    tick_interval_s = 0.05

    def __init__(
        self,
        metrics: ServiceMetrics,
        bind: str | Iterable[str],
        *,
        limits: Limits = DEFAULT_LIMITS,
        curve: CurveConfig | None = None,
        hwm: int = DEFAULT_HWM,
        ctx: zmq.Context[Any] | None = None,
    ) -> None:
        self.metrics = metrics
        self.name = f"{metrics.service}-{metrics.shard}"
        self.limits = limits
        self.auth_rejected = metrics.counter(
            "auth_rejected", "Connections refused by CurveZMQ: reason unknown_key (not allowlisted) or handshake.",
            ("reason",),
        )
        self.sock = make_socket(zmq.ROUTER, bind=bind, hwm=hwm, curve=curve, ctx=ctx, name=self.name,
                                on_reject=lambda reason, _fp: self.auth_rejected.labels(reason).inc())
        self.handlers: dict[str, Handler] = {}
        self._stop = threading.Event()
        self.replies_dropped = metrics.counter(
            "replies_dropped", "Replies not delivered: the peer was gone or its queue full."
        )
        self.seq = itertools.count(1)
        # messages and bytes by (type, direction), added to the Prometheus counters after each
        # burst: a counter increment per message and direction costs more than decoding a header
        self._traffic: dict[tuple[str, str], _Traffic] = {}

    @property
    def endpoint(self) -> str:
        return str(self.sock.getsockopt_string(zmq.LAST_ENDPOINT))

    def route(self, mtype: str, handler: Handler) -> None:
        self.handlers[mtype] = handler

    # -- replies ------------------------------------------------------------
    def reply(self, peer: Peer, msg: Message) -> bool:
        """Send ``msg`` to ``peer`` (ref_seq filled in). False if undeliverable."""
        return self.send_frames(peer, self.reply_frames(peer, msg), msg.type)

    def reply_frames(self, peer: Peer, msg: Message) -> list[Any]:
        """The encoded frames of a reply to ``peer`` (ref_seq, sender and seq filled in)."""
        msg.body.setdefault("ref_seq", peer.seq)
        msg.sender = msg.sender or self.name
        msg.seq = next(self.seq)
        return encode(msg)

    def send_frames(self, peer: Peer, frames: list[Any], mtype: str) -> bool:
        """Send encoded reply frames to ``peer``; False (and counted) if undeliverable."""
        try:
            # ROUTER refuses a message at its identity frame (peer gone, or its queue full
            # with ROUTER_MANDATORY), so nothing is half sent when this raises
            self.sock.send(peer.identity, _SNDMORE_NOBLOCK)
            send_parts(self.sock, frames, _NOBLOCK)
        except (zmq.Again, zmq.ZMQError) as exc:  # peer gone (EHOSTUNREACH) or queue full
            self.replies_dropped.inc()
            log.debug("%s: reply %s to %r dropped: %s", self.name, mtype, peer.sender, exc)
            return False
        self.count(mtype, "out", sum(map(len, frames)))
        return True

    def count(self, mtype: str, direction: str, nbytes: int) -> None:
        """Count one message in rlfleet_messages_total / rlfleet_bytes_total (added after the burst)."""
        t = self._traffic.get((mtype, direction))
        if t is None:
            t = self._traffic[(mtype, direction)] = _Traffic(self.metrics, mtype, direction)
        t.messages += 1
        t.bytes += nbytes

    def flush_counts(self) -> None:
        for t in self._traffic.values():
            if t.messages:
                t.flush()

    def reply_error(self, peer: Peer, reason: str, detail: str, *, count: bool = True) -> None:
        """Send an ``error`` whose ref_seq is the request's (-1 if it did not decode).

        Counted in rlfleet_protocol_errors_total unless ``count`` is False: an
        expected outcome such as a long poll's timeout is not a protocol error.
        """
        if count:
            self.metrics.protocol_errors.labels(reason).inc()
        self.reply(peer, Message("error", {"ref_seq": peer.seq, "reason": reason, "detail": detail[:1000]}))

    # -- loop ---------------------------------------------------------------
    def tick(self) -> None:
        """Timers: expire waits, checkpoint, ... Called at least every tick_interval_s."""

    def handle_frames(self, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        body = frames[1:]
        nbytes = sum(map(len, body))
        try:
            msg = decode(body, self.limits)
        except ProtocolError as exc:
            self.count("undecodable", "in", nbytes)
            self.reply_error(Peer(identity, -1), exc.reason, exc.detail)
            return
        self.count(msg.type, "in", nbytes)
        peer = Peer(identity, msg.seq, msg.sender)
        handler = self.handlers.get(msg.type)
        if handler is None:
            self.reply_error(
                peer, "unsupported_type",
                f"{self.metrics.service} does not serve {msg.type!r}; it serves {sorted(self.handlers)}",
            )
            return
        try:
            handler(peer, msg)
        except RequestError as exc:
            self.reply_error(peer, exc.reason, exc.detail, count=exc.count)
        except Exception as exc:  # a failing handler is logged; the loop goes on
            log.exception("%s: handler for %s failed", self.name, msg.type)
            self.reply_error(peer, "internal", f"{type(exc).__name__}: {exc}")

    def serve(self) -> None:
        """Serve until stop(). Drains bursts before ticking so ticks stay cheap."""
        self.metrics.up.set(1)
        poller = zmq.Poller()  # one for the loop: Socket.poll builds a Poller per call
        poller.register(self.sock, zmq.POLLIN)
        timeout_ms = int(self.tick_interval_s * 1000)
        try:
            while not self._stop.is_set():
                if poller.poll(timeout_ms):
                    for _ in range(1000):
                        try:
                            frames = recv_frames(self.sock)
                        except zmq.Again:
                            break
                        self.handle_frames(frames)
                self.tick()
                self.flush_counts()
        finally:
            self.flush_counts()
            self.metrics.up.set(0)

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self.sock.close(linger=0)


class Client:
    """A DEALER connection to one server, with request/reply matching by seq."""

    def __init__(
        self,
        address: str,
        sender: str,
        *,
        curve: CurveConfig | None = None,
        hwm: int = DEFAULT_HWM,
        limits: Limits = DEFAULT_LIMITS,
        ctx: zmq.Context[Any] | None = None,
        identity: bytes | None = None,
    ) -> None:
        self.address = address
        self.sender = sender
        self.limits = limits
        self.sock = make_socket(zmq.DEALER, connect=address, hwm=hwm, curve=curve, ctx=ctx, identity=identity)
        self._seq = itertools.count(1)

    def next_seq(self) -> int:
        return next(self._seq)

    def send(self, msg: Message, seq: int | None = None) -> int:
        """Send without waiting; returns the seq the reply will reference."""
        msg.sender = self.sender
        msg.seq = self.next_seq() if seq is None else seq
        send(self.sock, msg)
        return msg.seq

    def recv(self, timeout_s: float) -> Message:
        return recv(self.sock, timeout_s, self.limits)

    def request(self, msg: Message, timeout_s: float) -> Message:
        """Send and wait for the reply to this request (older replies are dropped).

        Raises CommTimeout, RemoteError for an ``error`` reply, ProtocolError
        for a reply that does not decode.
        """
        seq = self.send(msg)
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeout(f"{msg.type} to {self.address}: no reply within {timeout_s:.3g} s")
            reply = self.recv(left)
            if reply.get("ref_seq") not in (seq, -1):
                continue  # a late reply to an earlier request
            if reply.type == "error":
                raise RemoteError(reply["reason"], reply["detail"])
            return reply

    def close(self) -> None:
        self.sock.close(linger=0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Server", "Client", "Peer", "RequestError", "RemoteError", "CommTimeout"]
