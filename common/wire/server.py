"""The request loop every server runs (the client side is common/wire/connection.py).

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import zmq

from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import DEFAULT_LIMITS, Limits, Message, ProtocolError, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.errors import RequestError
from rlfleet.common.wire.transport import (
    DEFAULT_HWM,
    NOBLOCK,
    SNDMORE_NOBLOCK,
    CurveConfig,
    fingerprint,
    make_socket,
    recv_frames,
    send_parts,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Peer:
    """Where a reply goes: the ROUTER identity of the sender and its request seq."""

    identity: bytes
    seq: int
    sender: str = ""


Handler = Callable[[Peer, Message], None]

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
        # with CurveZMQ a sender id is its client's only: "<sender>@<key fingerprint>" everywhere
        # inside the server (dedup, logs), so no other key can reach a sender's seqs
        self.bind_senders = curve is not None
        self._owner_suffixes: dict[str, str] = {}
        self.sock = make_socket(zmq.ROUTER, bind=bind, hwm=hwm, curve=curve, ctx=ctx, name=self.name,
                                on_reject=lambda reason, _fp: self.auth_rejected.labels(reason).inc(),
                                max_frame_bytes=limits.max_message_bytes)
        self.handlers: dict[str, Handler] = {}
        # other sockets whose input wakes the loop (it then ticks): e.g. the answers of a server asked
        # without waiting; serve() polls those present when it starts
        self.watched: list[zmq.Socket[Any]] = []
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
    def reply(self, peer: Peer, msg: Message, *, copy: bool = True) -> bool:
        """Send ``msg`` to ``peer`` (ref_seq filled in). False if undeliverable.

        ``copy=False``: the arrays go without a copy; only for arrays whose memory never
        changes (see :func:`~rlfleet.common.wire.transport.send_parts`)."""
        return self.send_frames(peer, self.reply_frames(peer, msg), msg.type, copy=copy)

    def reply_frames(self, peer: Peer, msg: Message) -> list[Any]:
        """The encoded frames of a reply to ``peer`` (ref_seq, sender and seq filled in)."""
        msg.body.setdefault("ref_seq", peer.seq)
        msg.sender = msg.sender or self.name
        msg.seq = next(self.seq)
        return encode(msg)

    def send_frames(self, peer: Peer, frames: list[Any], mtype: str, *, copy: bool = True) -> bool:
        """Send encoded reply frames to ``peer``; False (and counted) if undeliverable."""
        try:
            # ROUTER refuses a message at its identity frame (peer gone, or its queue full
            # with ROUTER_MANDATORY), so nothing is half sent when this raises
            self.sock.send(peer.identity, SNDMORE_NOBLOCK)
            send_parts(self.sock, frames, NOBLOCK, copy)
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
        """Send an ``error`` whose ref_seq is the request's (-1 if its header had no readable seq).

        Counted in rlfleet_protocol_errors_total unless ``count`` is False: an
        expected outcome such as a long poll's timeout is not a protocol error.
        """
        if count:
            self.metrics.protocol_errors.labels(reason).inc()
        self.reply(peer, Message("error", {"ref_seq": peer.seq, "reason": reason, "detail": detail[:1000]}))

    def owner_suffix(self, frames: list[zmq.Frame]) -> str:
        """``"@<fingerprint>"`` of the CurveZMQ key that sent ``frames`` ("" without CurveZMQ)."""
        if not self.bind_senders:
            return ""
        user_id = str(frames[0].get("User-Id"))  # ZAP's user id: the client's public key (z85)
        suffix = self._owner_suffixes.get(user_id)
        if suffix is None:
            if len(self._owner_suffixes) >= 4096:
                self._owner_suffixes.clear()
            suffix = self._owner_suffixes[user_id] = "@" + fingerprint(user_id.encode())
        return suffix

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
            self.reply_error(Peer(identity, exc.seq), exc.reason, exc.detail)
            return
        self.count(msg.type, "in", nbytes)
        if self.bind_senders:
            msg.sender += self.owner_suffix(frames)
        peer = Peer(identity, msg.seq, msg.sender)
        handler = self.handlers.get(msg.type)
        if handler is None:
            self.reply_error(
                peer, "unsupported_type",
                f"{self.metrics.service} does not serve {msg.type!r}; it serves {sorted(self.handlers)}",
            )
            return
        self.run_handler(handler, peer, msg)

    def run_handler(self, handler: Handler, peer: Peer, msg: Message) -> None:
        """Run ``handler`` on a decoded message: a RequestError is answered with its error, any other
        exception logged and answered ``internal``; the loop goes on."""
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
        for sock in self.watched:
            poller.register(sock, zmq.POLLIN)
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
                        # a message's frames (up to the message limit, a refused one too) are freed once
                        # it is handled, not when the next message comes
                        del frames
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
