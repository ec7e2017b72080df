"""A two-node Docker Swarm on one machine: this machine's engine (node A, the manager) and a second
engine in its own network namespace (node B, a worker).

Node B is a real ``dockerd`` with its own data-root, exec-root, pidfile, socket, hostname (a UTS
namespace) and ``docker0``, started by ``nsenter --net`` into a namespace whose only link is one end
of a veth pair; the other end, in the root namespace, carries node A's swarm address. The two
engines share the kernel and the cgroup tree, nothing else: the swarm's overlay network (VXLAN
between the two addresses), its gossip and its scheduler are the ones two hosts use. Swarm's
routing mesh needs IPVS in the kernel; where the kernel has none (``CONFIG_IP_VS`` unset) published
ports in ingress mode do not answer, and :func:`unavailable` says so without failing: the fleet's
services use ``endpoint_mode: dnsrr`` and need no IPVS.

:meth:`NodeB.kill` is a power cut: SIGKILL to node B's dockerd, containerd, shims and every
container process at once (they are found by the namespace and by the cgroup parent node B puts
its containers under). :meth:`NodeB.start` brings it back from its data-root, as a host rebooting.

Everything needs root, ``ip``, ``nsenter``/``unshare`` (util-linux) and ``dockerd``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUBNET = "10.199.78"  # /24 on the veth pair only
ADDR_A = f"{SUBNET}.1"  # node A's swarm address (root namespace end of the veth)
ADDR_B = f"{SUBNET}.2"
NAME = "rlfnodeb"  # netns, hostname, cgroup parent and the prefix of every path of node B
STATE = Path("/var/lib/rlfleet-nodeb")  # data-root: kept between runs (images loaded once)
RUN = Path("/run/rlfleet-nodeb")  # exec-root, pidfile, socket: removed by close()
SOCKET = RUN / "docker.sock"
HOST = f"unix://{SOCKET}"
LABEL_CORE = "rlfleet.core"
LABEL_ACTORS = "rlfleet.actors"
CGROUP_ROOT = Path("/sys/fs/cgroup")


def unavailable() -> str | None:
    """Why a second engine cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (a network namespace, a second dockerd)"
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux"), ("unshare", "util-linux"),
                          ("dockerd", "docker.io")):
        if shutil.which(tool) is None:
            return f"'{tool}' not found (Debian package {package})"
    return None


def kernel_has_ipvs() -> bool:
    """Whether Swarm's routing mesh (IPVS) can work: False on kernels built without CONFIG_IP_VS."""
    if Path("/proc/net/ip_vs").exists():
        return True
    return subprocess.run(["modprobe", "-q", "ip_vs"], capture_output=True).returncode == 0 and \
        Path("/proc/net/ip_vs").exists()


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def docker_b(*args: str, timeout_s: float = 120) -> str:
    """The docker CLI against node B's engine."""
    proc = subprocess.run(["docker", "-H", HOST, *args], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"docker -H {HOST} {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class NodeB:
    """The second engine: ``with NodeB() as b`` makes the namespace and starts dockerd; leaving it
    stops dockerd and removes the namespace (the data-root stays, so images are loaded once)."""

    log: Path
    dockerd: subprocess.Popen[bytes] | None = None
    _made_ns: bool = field(default=False)

    def __enter__(self) -> NodeB:
        self.remove_leftovers()
        _sh("ip", "netns", "add", NAME)
        self._made_ns = True
        _sh("ip", "link", "add", f"{NAME}0", "type", "veth", "peer", "name", "eth0", "netns", NAME)
        _sh("ip", "addr", "add", f"{ADDR_A}/24", "dev", f"{NAME}0")
        _sh("ip", "link", "set", f"{NAME}0", "up")
        for cmd in (("addr", "add", f"{ADDR_B}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                    ("link", "set", "lo", "up"), ("route", "add", "default", "via", ADDR_A)):
            _sh("ip", "-n", NAME, *cmd)
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout_s: float = 120) -> None:
        """Start node B's dockerd (again, after :meth:`kill`) and wait until it answers."""
        RUN.mkdir(parents=True, exist_ok=True)
        STATE.mkdir(parents=True, exist_ok=True)
        dockerd = [
            "dockerd", "--data-root", str(STATE), "--exec-root", str(RUN / "exec"),
            "--pidfile", str(RUN / "dockerd.pid"), "-H", HOST, "--bip", "172.31.0.1/24",
            "--cgroup-parent", f"/{NAME}",
        ]
        # ip netns exec would remount /sys and hide the cgroup mounts dockerd needs: nsenter enters only
        # the network namespace. Idle priority, as this machine's first engine.
        inner = f"hostname {NAME} && exec chrt -i 0 {' '.join(dockerd)}"
        with self.log.open("ab") as out:
            self.dockerd = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{NAME}", "unshare", "--uts", "sh", "-c", inner],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            if subprocess.run(["docker", "-H", HOST, "info"], capture_output=True).returncode == 0:
                return
            if self.dockerd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node B's dockerd did not start (exit {self.dockerd.poll()}):\n{self.tail()}")
            time.sleep(1)

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def pids(self) -> list[int]:
        """Every process of node B: its dockerd, containerd and shims (in its network namespace) and
        its containers' processes (in its cgroup parent)."""
        out = subprocess.run(["ip", "netns", "pids", NAME], capture_output=True, text=True).stdout
        found = {int(p) for p in out.split() if p.isdigit()}
        for procs in CGROUP_ROOT.glob(f"*/{NAME}/*/cgroup.procs"):
            try:
                found.update(int(p) for p in procs.read_text().split())
            except OSError:
                continue
        return sorted(found)

    def kill(self) -> None:
        """Node B loses power: SIGKILL to all of it at once, nothing is told."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.dockerd is not None:
            self.dockerd.wait(timeout=30)
        deadline = time.monotonic() + 30
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM to dockerd (it stops its containers), then anything left is killed."""
        if self.dockerd is not None and self.dockerd.poll() is None:
            self.dockerd.terminate()
            try:
                self.dockerd.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def close(self) -> None:
        try:
            subprocess.run(["docker", "-H", HOST, "swarm", "leave", "--force"], capture_output=True, timeout=60)
            self.stop()
        finally:
            if self._made_ns:
                self.remove_leftovers()

    @staticmethod
    def remove_leftovers() -> None:
        """Delete what a killed test run left: node B's processes, namespace, veth and exec-root."""
        if Path(f"/run/netns/{NAME}").exists():
            NodeB(log=Path(os.devnull)).kill()
            subprocess.run(["ip", "netns", "del", NAME], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{NAME}0"], capture_output=True)
        for mount in reversed(Path("/proc/self/mounts").read_text().splitlines()):
            target = mount.split()[1]
            if target.startswith((str(RUN), f"{STATE}/")):
                subprocess.run(["umount", "-l", target], capture_output=True)
        shutil.rmtree(RUN, ignore_errors=True)


def load_image(image: str, timeout_s: float = 1800) -> bool:
    """``docker save image | docker -H B load``, unless node B holds the same image already; True
    when it was copied."""
    want = _sh("docker", "image", "inspect", "-f", "{{.Id}}", image).stdout.strip()
    have = subprocess.run(["docker", "-H", HOST, "image", "inspect", "-f", "{{.Id}}", image],
                          capture_output=True, text=True).stdout.strip()
    if have == want:
        return False
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    try:
        subprocess.run(["docker", "-H", HOST, "load", "-q"], stdin=save.stdout, check=True,
                       capture_output=True, timeout=timeout_s)
    finally:
        if save.stdout is not None:
            save.stdout.close()
        save.wait(timeout=60)
    return True


@dataclass
class TwoNodeSwarm:
    """Node A's engine made a swarm manager on the veth address (unless it already is one) and node B
    joined as a worker; the labels put the core on A and the actors on B. ``close()`` takes node B
    out and leaves the swarm if this made it (else gives A back its labels): the engine as found."""

    client_a: Any
    node_b: NodeB
    made_swarm: bool = False
    node_a_id: str = ""
    node_b_id: str = ""
    _labels_a: dict[str, str] = field(default_factory=dict)

    def __enter__(self) -> TwoNodeSwarm:
        info = self.client_a.info().get("Swarm", {})
        if info.get("LocalNodeState") == "active":
            if info.get("NodeAddr") != ADDR_A:
                raise RuntimeError(f"this engine is in a swarm already, advertised on {info.get('NodeAddr')}; "
                                   f"node B can only reach {ADDR_A}: leave that swarm first")
        else:
            self.client_a.swarm.init(advertise_addr=ADDR_A, listen_addr=f"{ADDR_A}:2377")
            self.made_swarm = True
        self.node_a_id = self.client_a.info()["Swarm"]["NodeID"]
        self._labels_a = dict(self.client_a.nodes.get(self.node_a_id).attrs["Spec"].get("Labels") or {})
        token = self.client_a.swarm.attrs["JoinTokens"]["Worker"]
        docker_b("swarm", "join", "--token", token, "--advertise-addr", ADDR_B, "--listen-addr",
                 f"{ADDR_B}:2377", f"{ADDR_A}:2377")
        self.node_b_id = docker_b("info", "-f", "{{.Swarm.NodeID}}").strip()
        self.label(core="a", actors="b")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def label(self, core: str, actors: str) -> None:
        """Put the core and the actors on node "a" or "b" (a label moved away is removed)."""
        for which, node_id in (("a", self.node_a_id), ("b", self.node_b_id)):
            self._set_labels(node_id, {key: where == which for key, where in ((LABEL_CORE, core),
                                                                                (LABEL_ACTORS, actors))})

    def _set_labels(self, node_id: str, labels: dict[str, bool]) -> None:
        node = self.client_a.nodes.get(node_id)
        spec = node.attrs["Spec"]
        held = spec.setdefault("Labels", {})
        for key, on in labels.items():
            if on:
                held[key] = "true"
            else:
                held.pop(key, None)
        node.update(spec)

    def node_state(self, which: str) -> str:
        node = self.client_a.nodes.get(self.node_a_id if which == "a" else self.node_b_id)
        return str(node.attrs["Status"]["State"])

    def close(self) -> None:
        try:
            subprocess.run(["docker", "-H", HOST, "swarm", "leave", "--force"], capture_output=True, timeout=60)
            if self.node_b_id:
                subprocess.run(["docker", "node", "rm", "--force", self.node_b_id], capture_output=True, timeout=60)
        finally:
            if self.made_swarm:
                self.client_a.swarm.leave(force=True)
            elif self.node_a_id:  # a swarm that was there before: A's labels as they were
                node = self.client_a.nodes.get(self.node_a_id)
                spec = node.attrs["Spec"]
                spec["Labels"] = self._labels_a
                node.update(spec)
