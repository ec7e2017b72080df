"""Weights to readers on other hosts: a paramserver shard, a publisher and readers in three network namespaces.

Hosts are network namespaces on one bridge (harness/netns.py): "ps" runs a
paramserver shard, "learner" publishes, "actors" runs two readers, so every
weights byte crosses a veth pair over TCP, as between machines. Namespaces
share the machine's /dev/shm, which a real other host does not: publisher and
readers are run with shared memory off, the path a reader on another host
takes once it finds no ``probe`` file. Each reader checks that every version
it assembles is one version (every tensor holds that version's value) and
that it reaches the last one; the test prints the latency of each publish
until both readers hold it (CLOCK_MONOTONIC is the same in every namespace).

Needs root, ``ip`` and ``nft`` (harness/netns.py); skipped otherwise (failed in CI).

    python -m tests.chaos.test_weights_netns publish|read ...   (the roles, run inside a namespace)
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from harness import netns, skips

ROOT = Path(__file__).resolve().parents[2]
PS_PORT = 5561
VERSIONS = 12
SHAPES = {"conv.w": (64, 32, 4, 4), "fc.w": (512, 2176), "fc.b": (512,), "head.w": (18, 512)}  # ~1.2M params


def model(version: int) -> dict[str, np.ndarray]:
    return {n: np.full(s, version, np.float32) for n, s in SHAPES.items()}


# -- the roles (run inside a namespace) ---------------------------------------------

def publish(address: str) -> None:
    from rlfleet.common.clients.weights_publisher import WeightsPublisher

    pub = WeightsPublisher([address], "learner", shm=False)
    sent = {}
    for version in range(VERSIONS + 1):
        time.sleep(0.3 if version == 0 else 0.1)  # readers parked (version 0 waits for their connections)
        tensors = model(version)
        sent[version] = time.monotonic_ns()
        pub.publish(version, tensors, timeout_s=20)
    pub.close()
    print("SENT " + json.dumps(sent), flush=True)


def read(address: str, name: str) -> None:
    from rlfleet.common.clients.weights_reader import WeightsReader
    from rlfleet.common.wire.errors import CommTimeout

    reader = WeightsReader([address], name, shm=False)
    got: dict[int, int] = {}
    bad: list[str] = []
    have = -1
    deadline = time.monotonic() + 60
    while have < VERSIONS and time.monotonic() < deadline:
        try:
            out = reader.wait(have + 1, 2.0)
        except CommTimeout:  # the shard is still starting
            continue
        if out is None:
            continue
        version, tensors = out
        got[version] = time.monotonic_ns()
        if set(tensors) != set(SHAPES):
            bad.append(f"v{version}: tensors {sorted(tensors)}")
        for t, arr in tensors.items():
            if arr.shape != SHAPES[t] or float(arr.min()) != version or float(arr.max()) != version:
                bad.append(f"v{version}: {t} {arr.shape} holds {arr.min()}..{arr.max()}")
        have = version
    reader.close()
    print("GOT " + json.dumps({"got": got, "bad": bad}), flush=True)


# -- the test --------------------------------------------------------------------------

@pytest.fixture
def lab(tmp_path: Path) -> Iterator[netns.Lab]:
    reason = netns.unavailable()
    if reason is not None:
        skips.missing("netns", f"network namespaces unusable: {reason}")
    with netns.Lab(tmp_path / "logs") as lab:
        yield lab


def _line(proc: netns.Proc, tag: str) -> dict:
    for line in proc.log.read_text(errors="replace").splitlines():
        if line.startswith(tag + " "):
            return dict(json.loads(line[len(tag) + 1:]))
    raise AssertionError(f"{proc.name} printed no {tag} line:\n{proc.tail()}")


def test_readers_on_another_host_assemble_every_version_over_tcp(lab: netns.Lab) -> None:
    ps, learner, actors = lab.add_host("ps", 1), lab.add_host("learner", 2), lab.add_host("actors", 3)
    address = f"tcp://{ps.addr}:{PS_PORT}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    shard = lab.start("paramserver", ps, [
        sys.executable, "-m", "rlfleet.services.paramserver.main", "--shard", "0", "--log-level", "WARNING",
        "--set", f"network.paramserver={json.dumps([address])}", "--set", "paramserver.shards=1",
        "--set", f"network.bind_host={ps.addr}", "--set", "metrics.port=0",
        "--set", "security.insecure=true",  # another "host" over plain TCP: a lab network
        "--set", f"metrics.host={ps.addr}"], env)
    me = [sys.executable, "-m", "tests.chaos.test_weights_netns"]
    readers = [lab.start(f"reader-{i}", actors, [*me, "read", address, f"actor-{i}"], env) for i in range(2)]
    time.sleep(1.0)  # the shard binds; readers park their first wait (they retry until it answers)
    publisher = lab.start("publisher", learner, [*me, "publish", address], env)
    for proc in (publisher, *readers):
        try:
            proc.popen.wait(90)
        except Exception:
            pass
        assert proc.popen.returncode == 0, f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}"
    assert shard.alive(), shard.tail()
    sent = {int(k): v for k, v in _line(publisher, "SENT").items()}
    got = [_line(r, "GOT") for r in readers]
    for r, g in zip(readers, got, strict=True):
        assert not g["bad"], f"{r.name} assembled a mixed or wrong version: {g['bad'][:5]}"
        versions = sorted(int(v) for v in g["got"])
        assert versions and versions[-1] == VERSIONS, f"{r.name} reached {versions}"
    both = [v for v in range(1, VERSIONS + 1) if all(str(v) in g["got"] for g in got)]
    lat = [(max(g["got"][str(v)] for g in got) - sent[v]) / 1e6 for v in both]
    print(f"publish -> both readers on another host hold it, 1.2M params over veth: "
          f"p50 {np.percentile(lat, 50):.1f} ms, max {max(lat):.1f} ms ({len(lat)} versions)")


if __name__ == "__main__":
    role, addr = sys.argv[1], sys.argv[2]
    if role == "publish":
        publish(addr)
    else:
        read(addr, sys.argv[3])
