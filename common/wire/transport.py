"""Socket construction in one place: linger 0, bounded queues, timeouts, CurveZMQ.

Works the same over ``tcp://``, ``ipc://`` and ``inproc://`` (inproc needs the
shared context from :func:`context`). Every blocking receive takes a timeout
and raises :class:`~rlfleet.common.wire.errors.CommTimeout` when it passes.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger(__name__)

DEFAULT_HWM = 1000

# A silent partition (packets lost, no TCP reset) must not leave a connection that looks alive:
# each side PINGs every HEARTBEAT_IVL_MS and drops a connection that sent nothing for
# HEARTBEAT_TIMEOUT_MS (libzmq answers PINGs in its I/O thread, so a busy service is not taken for
# a dead one); a dropped connection is retried every 100 ms, and CONNECT_TIMEOUT_MS abandons a
# connect whose SYNs are lost instead of waiting out the kernel's SYN back-off (minutes), so the
# connection is back within about CONNECT_TIMEOUT_MS of the network, and clients that watch their
# handshakes (InsertClient) resend at once.
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 10_000
CONNECT_TIMEOUT_MS = 2000
# A socket closes in libzmq's I/O thread, after close() returns: a service started again in the same
# process (an --inproc member, a test) can find its own old listener still holding its port. A bind that
# finds its address in use retries this long before the error is raised.
BIND_RETRY_S = 5.0


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
    """A short, loggable name for a public key (z85 text or 32 raw bytes)."""
    z85 = zmq.utils.z85.encode(public_key) if len(public_key) == 32 else public_key
    return hashlib.sha256(z85).hexdigest()[:12]


#: ``on_reject(reason, fingerprint)``: reason ``unknown_key`` (a CurveZMQ key that is not
#: allowlisted; fingerprint names it) or ``handshake`` (no CurveZMQ, the wrong server key
#: or garbage; fingerprint is "").
RejectFn = Callable[[str, str], None]

_rejected: dict[str, int] = {}
_rejected_lock = threading.Lock()
KEYS_NAMED = 5  # unknown keys logged one by one per server socket; the rest in a summary...
SUMMARY_EVERY_S = 60.0  # ...at most this often
KEYS_COUNTED = 1000  # fingerprints counted one by one per process; more are counted as "(other keys)"


class _Allowlist:
    """The ZAP credentials provider of one server socket: accepts exactly its allowlisted keys.

    Every rejection is reported to ``on_reject``. The log stays short whatever a stranger does:
    the first KEYS_NAMED unknown keys are logged by fingerprint, refusals after them in one
    summary line at most every SUMMARY_EVERY_S seconds, and the first failed handshake once.
    """

    def __init__(self, allowed: Iterable[bytes], name: str, on_reject: RejectFn | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # seconds, for SUMMARY_EVERY_S (tests pass a fake one)
        self.allowed = {zmq.utils.z85.encode(k) if len(k) == 32 else k for k in allowed}
        self.name = name or "server"
        self.on_reject = on_reject
        self._named: set[str] = set()
        self._handshake_logged = False
        self._quiet = 0  # refusals since the last log line about unknown keys
        self._summary_at = 0.0
        self._lock = threading.Lock()

    def callback(self, domain: str, key: bytes) -> bool:
        z85 = zmq.utils.z85.encode(key) if len(key) == 32 else key
        if z85 in self.allowed:
            return True
        self.reject("unknown_key", fingerprint(z85))
        return False

    def reject(self, reason: str, fp: str) -> None:
        with _rejected_lock:
            name = fp or "(handshake)"
            if name not in _rejected and len(_rejected) >= KEYS_COUNTED:
                name = "(other keys)"
            _rejected[name] = _rejected.get(name, 0) + 1
        if self.on_reject is not None:
            self.on_reject(reason, fp)
        if reason != "unknown_key":
            with self._lock:
                first, self._handshake_logged = not self._handshake_logged, True
            if first:
                log.warning("%s: refused a connection whose handshake failed (a client without CurveZMQ, "
                            "with the wrong server key, or not ZeroMQ at all); further ones are only counted",
                            self.name)
            return
        now = self.clock()
        with self._lock:
            known = fp in self._named
            name_it = not known and len(self._named) < KEYS_NAMED
            if name_it:
                self._named.add(fp)
            else:
                self._quiet += 1
            summary = not name_it and self._quiet and now - self._summary_at >= SUMMARY_EVERY_S and \
                len(self._named) >= KEYS_NAMED
            if summary:
                quiet, self._quiet, self._summary_at = self._quiet, 0, now
        if name_it:
            log.warning("%s: refused a client whose CurveZMQ key is not allowlisted (fingerprint %s); "
                        "further refusals of this key are only counted", self.name, fp)
        elif summary:
            log.warning("%s: refused %d more connections with keys that are not allowlisted (after the %d"
                        " named above); counted in rlfleet_auth_rejected_total, logged at most every %.0f s",
                        self.name, quiet, KEYS_NAMED, SUMMARY_EVERY_S)


_auth_lock = threading.Lock()
_authenticators: dict[int, tuple[zmq.Context[Any], ThreadAuthenticator]] = {}
_domains = itertools.count(1)


def _authenticator(ctx: zmq.Context[Any]) -> ThreadAuthenticator:
    """One ZAP handler per context (ZAP requests never leave their context)."""
    with _auth_lock:
        entry = _authenticators.get(id(ctx))
        if entry is None or entry[0] is not ctx:
            auth = ThreadAuthenticator(ctx, log=logging.getLogger("rlfleet.zap"))
            auth.start()
            entry = _authenticators[id(ctx)] = (ctx, auth)
        return entry[1]


def rejected_clients() -> dict[str, int]:
    """Refusals so far in this process, by key fingerprint ("(handshake)" for failed handshakes)."""
    with _rejected_lock:
        return dict(_rejected)


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
    name: str = "",
    on_reject: RejectFn | None = None,
    max_frame_bytes: int | None = None,
) -> zmq.Socket[Any]:
    """A socket with linger 0, bounded send/receive queues and a send timeout.

    ``max_frame_bytes`` (ZMQ_MAXMSGSIZE): a peer that sends a larger frame is disconnected by
    libzmq as the frame's size arrives, before its body is read: servers set it to the largest
    message they accept, so an oversized message never occupies their memory.

    With ``curve`` a socket that binds is a CurveZMQ server that accepts only
    ``curve.allowed_clients`` (its own ZAP domain) and reports every refused
    connection to ``on_reject`` (``name`` labels its log lines); one that
    connects is a CurveZMQ client of ``curve.server_key``.
    """
    ctx = ctx or context()
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    # A send to a peer whose queue is full (or that never came) fails after this
    # long with CommTimeout instead of blocking forever and ignoring SIGTERM.
    sock.setsockopt(zmq.SNDTIMEO, send_timeout_ms)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if max_frame_bytes is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    if kind == zmq.ROUTER:
        # A reply to a peer that has gone is an error we can count, not a silent drop.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if curve is not None:
        _apply_curve(sock, ctx, curve, bind is not None, name, on_reject)
    try:
        for addr in [bind] if isinstance(bind, str) else (bind or []):
            bind_retrying(sock, addr)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    for addr in [connect] if isinstance(connect, str) else (connect or []):
        sock.connect(addr)
    return sock


def bind_retrying(sock: zmq.Socket[Any], addr: str, retry_s: float = BIND_RETRY_S) -> None:
    """``sock.bind(addr)``, again every 50 ms for up to ``retry_s`` while the address is in use (see
    BIND_RETRY_S); then the error, naming the address."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            sock.bind(addr)
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() >= deadline:
                raise
        time.sleep(0.05)


def _apply_curve(
    sock: zmq.Socket[Any], ctx: zmq.Context[Any], curve: CurveConfig, server: bool, name: str,
    on_reject: RejectFn | None,
) -> None:
    sock.curve_secretkey = curve.secret_key
    sock.curve_publickey = curve.public_key
    if not server:
        if curve.server_key is None:
            raise ValueError("a CurveZMQ client needs the server's public key (CurveConfig.server_key)")
        sock.curve_serverkey = curve.server_key
        return
    # A ZAP domain of its own: each server socket has its own allowlist and its own counter.
    domain = f"rlfleet-{next(_domains)}"
    allow = _Allowlist(curve.allowed_clients, name, on_reject)
    auth = _authenticator(ctx)
    auth.configure_curve_callback(domain=domain, credentials_provider=allow)
    sock.zap_domain = domain.encode()
    sock.curve_server = True
    # A client without CurveZMQ never reaches ZAP: only the socket's events tell of it.
    monitor = monitor_socket(sock, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                             | zmq.EVENT_MONITOR_STOPPED)
    threading.Thread(target=_watch_handshakes, args=(sock, monitor, allow, auth, domain), name=f"zap-{name}",
                     daemon=True).start()


_monitors = itertools.count(1)


def monitor_socket(sock: zmq.Socket[Any], events: int) -> zmq.Socket[Any]:
    """A PAIR socket receiving ``sock``'s events (``zmq.utils.monitor.recv_monitor_message`` reads them).

    pyzmq's ``get_monitor_socket()`` names the endpoint after the socket's file
    descriptor, which a socket opened right after a close reuses while libzmq's
    reaper has not yet unbound the old monitor's endpoint ("Address already in
    use"): every monitor here gets a name of its own.
    """
    addr = f"inproc://rlfleet-monitor-{next(_monitors)}"
    sock.monitor(addr, events)
    monitor = sock.context.socket(zmq.PAIR)
    monitor.connect(addr)
    return monitor


def _watch_handshakes(sock: zmq.Socket[Any], monitor: zmq.Socket[Any], allow: _Allowlist,
                      auth: ThreadAuthenticator, domain: str) -> None:
    """Count failed handshakes of one server socket until it closes (libzmq then stops the monitor).

    Another monitor set on the socket stops this one too: then only the
    counting ends; the allowlist stays until the socket is closed.
    """
    try:
        while True:
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_MONITOR_STOPPED:
                return
            allow.reject("handshake", "")
    except zmq.ZMQError:  # the context was terminated
        pass
    finally:
        monitor.close(linger=0)
        if sock.closed:
            auth.credentials_providers.pop(domain, None)


# -- the fast send and receive every loop uses ---------------------------------------
NOBLOCK = int(zmq.NOBLOCK)  # plain ints: pyzmq's enum flags cost a Python call per use
SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
# the compiled send: pyzmq's Python-level Socket.send only adds the draft routing_id/group
# arguments, and costs ~0.6 us a frame
_send = zmq.backend.Socket.send


def send_parts(sock: zmq.Socket[Any], frames: Sequence[Any], flags: int = 0, copy: bool = True) -> None:
    """``send_multipart(frames, flags)`` at half the cost (plain int flags, pyzmq's compiled send).

    By default every frame is copied into its ZeroMQ message, also large ones: without a
    copy ZeroMQ reads a buffer after this returns, possibly much later (a slow peer's
    queue), and a paramserver reply's arrays may be views of a shared-memory file that is
    reused for a later version once dropped. Small frames (the usual replies, inserts)
    cost less copied.

    ``copy=False`` is only for frames whose memory never changes while it is referenced:
    pyzmq then keeps a reference to each buffer until ZeroMQ has sent it (frames under
    pyzmq's copy threshold, 64 kB, are copied all the same). Views of frames this process
    received are such buffers (a received ZeroMQ message is never written to or reused).
    """
    last = len(frames) - 1
    more = flags | _SNDMORE
    for i, frame in enumerate(frames):
        _send(sock, frame, more if i < last else flags, copy)


def recv_frames(sock: zmq.Socket[Any]) -> list[zmq.Frame]:
    """One whole multipart message without waiting (zmq.Again if none is queued).

    The same as ``recv_multipart(NOBLOCK, copy=False)`` at half the cost:
    each Frame says whether more follow, so no RCVMORE query per frame.
    """
    frame = sock.recv(NOBLOCK, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(NOBLOCK, copy=False)
        frames.append(frame)
    return frames


_handed_out: set[int] = set()  # ports free_tcp_port() gave this process (each at most once)


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (and for binds to port 0)."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, for a server to bind a moment later (tests and the local launcher).

    Drawn below the kernel's ephemeral range: a port from bind(("", 0)) comes
    from that range, and every outgoing connection (a ZeroMQ client's, a
    scrape's) takes its local port from it too, so between the choice and the
    bind one of them could take it ("Address already in use", seen in CI). A
    port is handed out at most once per process and is checked free by binding it.
    """
    import socket

    low, _ = ephemeral_ports()
    top = min(low, 65536)
    if top - 10000 >= 1000:
        rng = random.Random()
        for _ in range(200):
            port = rng.randrange(10000, top)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:  # an unusual range: the kernel's choice
        s.bind((host, 0))
        return int(s.getsockname()[1])
