"""Socket construction in one place: linger 0, bounded queues, timeouts, CurveZMQ.

Works the same over ``tcp://``, ``ipc://`` and ``inproc://`` (inproc needs the
shared context from :func:`context`). Every blocking receive takes a timeout
and raises :class:`CommTimeout` when it passes.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from common.protocol import DEFAULT_LIMITS, Limits, Message, decode, encode

log = logging.getLogger(__name__)

DEFAULT_HWM = 1000


class CommTimeout(TimeoutError):
    """A blocking socket operation did not complete within its timeout."""


def context() -> zmq.Context[Any]:
    """The process-wide context; inproc:// endpoints only meet within one."""
    return zmq.Context.instance()


@dataclass
class CurveConfig:
    """CurveZMQ settings for one socket.

    Servers set ``secret_key``/``public_key`` and ``allowed_clients`` (z85
    public keys); clients set their own pair and ``server_key``.
    """

    public_key: bytes
    secret_key: bytes
    server_key: bytes | None = None
    allowed_clients: Sequence[bytes] = field(default_factory=tuple)


def fingerprint(public_key: bytes) -> str:
    """A short, loggable name for a public key."""
    return hashlib.sha256(public_key).hexdigest()[:12]


class _Allowlist:
    """ZAP credentials provider: accepts exactly the allowlisted client keys."""

    def __init__(self) -> None:
        self.allowed: set[bytes] = set()
        self.rejected: dict[str, int] = {}
        self._lock = threading.Lock()

    def callback(self, domain: str, key: bytes) -> bool:
        z85 = zmq.utils.z85.encode(key) if len(key) == 32 else key
        if z85 in self.allowed:
            return True
        fp = fingerprint(z85)
        with self._lock:
            first = fp not in self.rejected
            self.rejected[fp] = self.rejected.get(fp, 0) + 1
        if first:
            log.warning("rejected a client whose CurveZMQ key is not allowlisted (fingerprint %s)", fp)
        return False


_auth_lock = threading.Lock()
_auth: tuple[ThreadAuthenticator, _Allowlist] | None = None


def _authenticator(ctx: zmq.Context[Any]) -> _Allowlist:
    """One ZAP authenticator per process (ZAP is per context)."""
    global _auth
    with _auth_lock:
        if _auth is None:
            auth = ThreadAuthenticator(ctx, log=logging.getLogger("rlfleet.zap"))
            auth.start()
            allow = _Allowlist()
            auth.configure_curve_callback(domain="*", credentials_provider=allow)
            _auth = (auth, allow)
        return _auth[1]


def rejected_clients() -> dict[str, int]:
    """Rejections so far by key fingerprint (empty when curve is off)."""
    return dict(_auth[1].rejected) if _auth else {}


def make_socket(
    kind: int,
    *,
    bind: str | Iterable[str] | None = None,
    connect: str | Iterable[str] | None = None,
    hwm: int = DEFAULT_HWM,
    identity: bytes | None = None,
    curve: CurveConfig | None = None,
    ctx: zmq.Context[Any] | None = None,
    send_timeout_ms: int = 2000,
) -> zmq.Socket[Any]:
    """A socket with linger 0, bounded send/receive queues and a send timeout."""
    ctx = ctx or context()
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    # A send to a peer whose queue is full (or that never came) fails after this
    # long with CommTimeout instead of blocking forever and ignoring SIGTERM.
    sock.setsockopt(zmq.SNDTIMEO, send_timeout_ms)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if kind == zmq.ROUTER:
        # A reply to a peer that has gone is an error we can count, not a silent drop.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if curve is not None:
        _apply_curve(sock, ctx, curve, server=bind is not None)
    for addr in [bind] if isinstance(bind, str) else (bind or []):
        sock.bind(addr)
    for addr in [connect] if isinstance(connect, str) else (connect or []):
        sock.connect(addr)
    return sock


def _apply_curve(sock: zmq.Socket[Any], ctx: zmq.Context[Any], curve: CurveConfig, server: bool) -> None:
    sock.curve_secretkey = curve.secret_key
    sock.curve_publickey = curve.public_key
    if server:
        allow = _authenticator(ctx)
        allow.allowed.update(curve.allowed_clients)
        sock.curve_server = True
    else:
        if curve.server_key is None:
            raise ValueError("a CurveZMQ client needs the server's public key (CurveConfig.server_key)")
        sock.curve_serverkey = curve.server_key


def send(sock: zmq.Socket[Any], msg: Message, identity: Sequence[bytes] = ()) -> int:
    """Encode and send ``msg`` without copying its arrays; returns bytes sent.

    Raises CommTimeout if the peer's queue is full and SNDTIMEO passes.
    """
    frames = encode(msg)
    try:
        sock.send_multipart([*identity, *frames], copy=False)
    except zmq.Again:
        raise CommTimeout(f"send of {msg.type} timed out (peer queue full)") from None
    return sum(len(f) for f in frames)


def recv(sock: zmq.Socket[Any], timeout_s: float, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Receive and decode one message, or raise CommTimeout after ``timeout_s``.

    Raises ProtocolError for a message that does not decode.
    """
    if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
        raise CommTimeout(f"no reply within {timeout_s:.3g} s")
    frames = sock.recv_multipart(copy=False)
    return decode(frames, limits)


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A port that is free now (for tests and the local launcher)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
