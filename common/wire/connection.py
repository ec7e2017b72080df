"""The one client-side receive loop: a DEALER connection to one server, and a poller over several.

Every client of a server (replay inserts and samples, paramserver publishes,
reads, registry calls and version probes) talks through a :class:`Connection`:

- it numbers its requests (``seq``) and matches replies by ``ref_seq``: a
  reply to an earlier request that was given up on arrives late and is
  dropped, and an ``error`` with ``ref_seq`` -1 (a request the server could
  not decode) answers whatever is awaited;
- it reads without waiting (:meth:`Connection.replies`) and decodes with its
  :class:`~rlfleet.common.wire.codec.Limits`; a reply that does not decode is logged
  and counted (``undecodable``), never raised out of a drain;
- with ``watch_handshakes`` it watches its own socket's CurveZMQ/ZMTP
  handshakes: a handshake after the first means the server restarted or the
  network came back (what the server held for this client is gone), and
  :meth:`Connection.reconnected` reports each such reconnection once.

:class:`Poller` waits on several connections (their sockets and their
handshake monitors) with one deadline; :func:`collect` gathers one reply per
connection to requests already sent (scatter/gather).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import zmq

from rlfleet.common.wire.codec import DEFAULT_LIMITS, Limits, Message, ProtocolError, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.common.wire.transport import (
    DEFAULT_HWM,
    NOBLOCK,
    CurveConfig,
    make_socket,
    monitor_socket,
    recv_frames,
    send_parts,
)

log = logging.getLogger(__name__)

_HANDSHAKE_SUCCEEDED = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)


class Connection:
    """A DEALER connected to one server: seqs, sends, non-blocking decoded receives, handshake events."""

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
        watch_handshakes: bool = False,
        seq_start: int = 1,
    ) -> None:
        self.address = address
        self.sender = sender
        self.limits = limits
        self.sock = make_socket(zmq.DEALER, hwm=hwm, curve=curve, ctx=ctx, identity=identity)
        self._seq = itertools.count(seq_start)
        self.undecodable = 0  # replies that did not decode (logged, then dropped)
        self._expected: dict[int, Message | None] = {}  # seq -> its reply once read (see expect)
        self.connects = 0  # handshakes that succeeded (watch_handshakes only)
        self.monitor: zmq.Socket[Any] | None = None
        if watch_handshakes:
            # attached before connecting: the first handshake can finish within microseconds of
            # connect(), and a monitor attached after it would count the first reconnection as the
            # first connection
            self.monitor = monitor_socket(self.sock, zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.sock.connect(address)

    # -- sending --------------------------------------------------------------
    def next_seq(self) -> int:
        return next(self._seq)

    def seqs_from(self, first: int) -> None:
        """Number the following requests from ``first`` (where the server says a sender's seqs start)."""
        self._seq = itertools.count(first)

    def send(self, msg: Message, seq: int | None = None, *, packed: bool = False) -> int:
        """Send, waiting at most the socket's send timeout; returns the seq the reply will reference.

        The arrays go without a copy (``copy=False``): they must not change until
        the reply came. ``packed``: all arrays copied into one payload frame (cheaper
        for many small arrays). Raises CommTimeout when the server's queue stays full.
        """
        msg.sender = self.sender
        msg.seq = self.next_seq() if seq is None else seq
        try:
            self.sock.send_multipart(encode(msg, packed=packed), copy=False)
        except zmq.Again:
            raise CommTimeout(f"send of {msg.type} to {self.address} timed out (peer queue full)") from None
        return msg.seq

    def try_send(self, msg: Message) -> int | None:
        """Send without waiting; the seq, or None when the send queue is full (nothing sent)."""
        msg.sender = self.sender
        msg.seq = self.next_seq()
        try:
            self.sock.send_multipart(encode(msg), copy=False, flags=NOBLOCK)
        except zmq.Again:
            return None
        return msg.seq

    def send_frames(self, frames: Sequence[Any]) -> bool:
        """Send frames already encoded (the insert fast path) without waiting; False when the queue is full."""
        try:
            send_parts(self.sock, frames, NOBLOCK)
        except zmq.Again:
            return False
        return True

    # -- receiving ------------------------------------------------------------
    def replies(self) -> Iterator[Message]:
        """Every reply already queued, decoded, without waiting; undecodable ones are logged and skipped."""
        sock = self.sock
        while True:
            try:
                frames = recv_frames(sock)
            except zmq.Again:
                return
            try:
                yield decode(frames, self.limits)
            except ProtocolError as exc:
                self.undecodable += 1
                log.warning("%s: undecodable reply from %s: %s", self.sender, self.address, exc)

    def reply_to(self, seq: int) -> Message | None:
        """The reply to request ``seq`` if it came, else None; replies read meanwhile to requests given up
        on (late) are dropped, those to requests another caller awaits (:meth:`expect`) are kept for it."""
        expected = self._expected
        if expected and expected.get(seq) is not None:
            return expected.pop(seq)
        for msg in self.replies():
            ref = msg.get("ref_seq")
            if ref == seq or ref == -1:
                expected.pop(seq, None)
                return msg
            if type(ref) is int and ref in expected:
                expected[ref] = msg
        return None

    def expect(self, seq: int) -> None:
        """Keep the reply to ``seq`` when another request's wait on this connection reads it first
        (two callers share the connection: the learner's version probe and its publishes)."""
        self._expected[seq] = None

    def forget(self, seq: int) -> None:
        """No longer keep the reply to ``seq`` (given up on): it will be dropped as late."""
        self._expected.pop(seq, None)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for something to read; True if there is."""
        return bool(self.sock.poll(max(0, int(timeout_s * 1000)), zmq.POLLIN))

    def recv(self, timeout_s: float) -> Message:
        """The next message, waiting up to ``timeout_s``; raises CommTimeout, or ProtocolError if it does not
        decode."""
        if not self.wait(timeout_s):
            raise CommTimeout(f"no reply from {self.address} within {timeout_s:.3g} s")
        return decode(self.sock.recv_multipart(copy=False), self.limits)

    def request(self, msg: Message, timeout_s: float) -> Message:
        """Send and wait for the reply to this request (late replies to earlier ones are dropped).

        Raises CommTimeout, RemoteError for an ``error`` reply; a reply that
        does not decode is logged and counted, and the wait goes on.
        """
        seq = self.send(msg)
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self.reply_to(seq)
            if reply is not None:
                if reply.type == "error":
                    raise RemoteError(reply["reason"], reply["detail"])
                return reply
            left = deadline - time.monotonic()
            if left <= 0 or not self.wait(left):
                raise CommTimeout(f"{msg.type} to {self.address}: no reply within {timeout_s:.3g} s")

    # -- connection events ----------------------------------------------------
    def reconnected(self) -> int:
        """Reconnections (handshakes after the first) since the last call, each reported once."""
        if self.monitor is None:
            return 0
        before = max(0, self.connects - 1)
        while True:
            try:
                frames = self.monitor.recv_multipart(NOBLOCK)
            except zmq.Again:
                break
            if frames and len(frames[0]) >= 2 and int.from_bytes(frames[0][:2], "little") == _HANDSHAKE_SUCCEEDED:
                self.connects += 1
        return max(0, self.connects - 1) - before

    @property
    def reconnects(self) -> int:
        """Connections after the first (a restarted server, a network that came back)."""
        return max(0, self.connects - 1)

    def close(self) -> None:
        if self.monitor is not None:
            try:
                self.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self.monitor.close(linger=0)
        self.sock.close(linger=0)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Poller:
    """Waits on several connections at once: their sockets and their handshake monitors."""

    def __init__(self, connections: Sequence[Connection] = ()) -> None:
        self._poller = zmq.Poller()  # one for the client: Socket.poll builds a Poller per call
        self._by_sock: dict[Any, Connection] = {}
        for conn in connections:
            self.add(conn)

    def add(self, conn: Connection) -> None:
        for sock in (conn.sock, conn.monitor):
            if sock is not None:
                self._poller.register(sock, zmq.POLLIN)
                self._by_sock[sock] = conn

    def remove(self, conn: Connection) -> None:
        for sock in (conn.sock, conn.monitor):
            if sock is not None and sock in self._by_sock:
                self._poller.unregister(sock)
                del self._by_sock[sock]

    def wait(self, timeout_s: float) -> list[Connection]:
        """The connections with replies or handshake events, waiting up to ``timeout_s`` for one."""
        ready: list[Connection] = []
        for sock, _ in self._poller.poll(max(0, int(timeout_s * 1000))):
            conn = self._by_sock[sock]
            if conn not in ready:
                ready.append(conn)
        return ready


K = TypeVar("K", bound=Hashable)


def collect(pending: Mapping[K, tuple[Connection, int]], deadline: float,
            resend: Callable[[K], None] | None = None) -> dict[K, Message]:
    """One reply for each (connection, seq) of requests already sent, until ``deadline`` (monotonic).

    ``error`` replies are returned like the others; the keys missing from the
    result did not answer in time. With ``resend``, a connection that reconnects
    while its reply is awaited (the server restarted: the request was lost with the
    old connection) has its request sent again (``resend(key)``, the same seq).
    """
    out: dict[K, Message] = {}
    waiting = {key: pair for key, pair in pending.items()}
    poller = Poller([conn for conn, _ in waiting.values()])
    while waiting:
        for key, (conn, seq) in list(waiting.items()):
            reply = conn.reply_to(seq)
            if reply is not None:
                out[key] = reply
                poller.remove(conn)
                del waiting[key]
            elif conn.monitor is not None and conn.reconnected() and resend is not None:
                resend(key)
        left = deadline - time.monotonic()
        if not waiting or left <= 0:
            break
        poller.wait(max(left, 0.001))
    return out
