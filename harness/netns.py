"""Hosts made of Linux network namespaces, for the partition test.

:class:`Lab` builds a private L2 segment: a fourth namespace (the "switch")
holds a bridge, and every host namespace gets one veth into it with an
address of its own in :data:`SUBNET`. Nothing has a default route and the
root namespace gets no address or route, so traffic stays between these
test hosts (and their loopbacks). The switch namespace also has an address:
it is the observer the test scrapes ``/metrics`` from (a thread that has
entered that namespace with setns(2)), so cutting a host off from its peers
does not blind the test.

:meth:`Lab.cut` drops every packet between one host and a list of peers with
an nftables table inside the host's namespace, both directions: packets are
silently lost and no TCP reset is sent, as when a cable or a switch port dies.
:meth:`Lab.heal` deletes that table.

Everything needs root and ``ip`` (iproute2) and ``nft`` (nftables);
:func:`unavailable` says why a machine cannot run it.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

SUBNET = "10.199.77"  # /24; exists only inside the lab's namespaces
PREFIX = "rlfnp"  # namespace names: rlfnp<pid>-<host>, so leftovers of dead test runs can be found
CUT_TABLE = "rlfleet_partition"
CLONE_NEWNET = 0x40000000

T = TypeVar("T")


def unavailable() -> str | None:
    """Why network namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (ip netns, nft)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"'{tool}' not found (Debian package {package})"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
        _sh(["ip", "netns", "exec", probe, "nft", "list", "ruleset"])
    except subprocess.CalledProcessError as exc:
        return f"'{' '.join(exc.cmd)}' failed: {(exc.stderr or '').strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _sh(argv: Sequence[str], stdin: str | None = None) -> str:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=True).stdout


def _ip(*args: str) -> str:
    return _sh(["ip", *args])


def remove_stale_namespaces() -> list[str]:
    """Delete lab namespaces left by test runs whose process is gone (killed mid-test)."""
    removed = []
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for p in _netns_pids(name):
                _kill_group(p, signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            removed.append(name)
    return removed


def _netns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@dataclass
class Host:
    name: str
    ns: str
    addr: str


@dataclass
class Proc:
    name: str
    host: Host
    popen: subprocess.Popen[bytes]
    log: Path
    _out: IO[bytes] | None = None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class Lab:
    """A bridge in a switch namespace plus host namespaces; ``close()`` removes all of it."""

    logs: Path
    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    observer_addr: str = f"{SUBNET}.254"
    _namespaces: list[str] = field(default_factory=list)
    _observer: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def __enter__(self) -> Lab:
        remove_stale_namespaces()
        self._add_ns(self.switch)
        self._in(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self._in(self.switch, "ip", "link", "set", "br0", "up")
        self._in(self.switch, "ip", "addr", "add", f"{self.observer_addr}/24", "dev", "br0")
        return self

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._namespaces.append(ns)
        self._in(ns, "ip", "link", "set", "lo", "up")

    def _in(self, ns: str, *argv: str, stdin: str | None = None) -> str:
        return _sh(["ip", "netns", "exec", ns, *argv], stdin=stdin)

    def add_host(self, name: str, octet: int) -> Host:
        """A namespace with eth0 = ``SUBNET.octet/24`` plugged into the bridge."""
        host = Host(name, f"{self.tag}-{name}", f"{SUBNET}.{octet}")
        self._add_ns(host.ns)
        port = f"p-{name}"[:15]
        # created inside the host namespace, its peer sent straight to the switch: no name in the root ns
        _ip("-n", host.ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", self.switch)
        self._in(self.switch, "ip", "link", "set", port, "master", "br0", "up")
        self._in(host.ns, "ip", "addr", "add", f"{host.addr}/24", "dev", "eth0")
        self._in(host.ns, "ip", "link", "set", "eth0", "up")
        self.hosts[name] = host
        return host

    # -- processes ----------------------------------------------------------
    def start(self, name: str, host: Host, argv: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        """Run ``argv`` in ``host``'s namespace (own session, output to logs/<name>.log)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        out = open(log, "wb")  # noqa: SIM115 (closed in close())
        popen = subprocess.Popen(["ip", "netns", "exec", host.ns, *argv], stdout=out, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        proc = Proc(name, host, popen, log, out)
        self.procs.append(proc)
        return proc

    def terminate(self, proc: Proc, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code (None if it had to be killed)."""
        if proc.alive():
            proc.popen.send_signal(signal.SIGTERM)
            try:
                return proc.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(5)
                return None
        return proc.popen.returncode

    # -- the partition -------------------------------------------------------
    def cut(self, host: Host, peers: Sequence[Host]) -> None:
        """Drop every packet between ``host`` and ``peers``, both ways, silently (no RST, no ICMP)."""
        addrs = ", ".join(p.addr for p in peers)
        rules = (f"table inet {CUT_TABLE} {{\n"
                 f"  chain in {{ type filter hook input priority -10; policy accept; "
                 f"ip saddr {{ {addrs} }} drop; }}\n"
                 f"  chain out {{ type filter hook output priority -10; policy accept; "
                 f"ip daddr {{ {addrs} }} drop; }}\n"
                 f"}}\n")
        self._in(host.ns, "nft", "-f", "-", stdin=rules)

    def heal(self, host: Host) -> None:
        self._in(host.ns, "nft", "delete", "table", "inet", CUT_TABLE)

    def dropped(self, host: Host) -> str:
        """The cut's ruleset (for failure messages)."""
        return self._in(host.ns, "nft", "list", "ruleset")

    # -- observing -------------------------------------------------------------
    def observe(self, fn: Callable[..., T], *args: Any) -> T:
        """Call ``fn`` in a thread that lives in the switch namespace (its sockets are made there)."""
        if self._observer is None:
            fd = os.open(f"/var/run/netns/{self.switch}", os.O_RDONLY)
            self._observer = concurrent.futures.ThreadPoolExecutor(1, "netns-observer", _enter_netns, (fd,))
        return self._observer.submit(fn, *args).result()

    def http_get(self, url: str, timeout_s: float = 2.0) -> bytes:
        def get() -> bytes:
            with urllib.request.urlopen(url, timeout=timeout_s) as r:
                return bytes(r.read())
        return self.observe(get)

    # -- cleanup ---------------------------------------------------------------
    def close(self) -> None:
        for proc in self.procs:
            if proc.alive():
                _kill_group(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(10)
            if proc._out is not None:
                proc._out.close()
        if self._observer is not None:
            self._observer.shutdown(wait=True)
        for ns in reversed(self._namespaces):
            for pid in _netns_pids(ns):  # anything a service started that outlived it
                _kill_group(pid, signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._namespaces.clear()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _enter_netns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns into the lab's switch namespace: {os.strerror(err)}")
    os.close(fd)
