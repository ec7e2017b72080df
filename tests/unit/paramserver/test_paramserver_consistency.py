"""Readers never assemble a mixed version while a publisher races them (real processes)."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import numpy as np

from harness.paramserver_procs import ShardProcesses
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader

SHAPES = {"conv": (32, 16, 3, 3), "fc1": (512, 64), "fc1_b": (64,), "head": (64, 6), "head_b": (6,),
          "steps": (3,)}


def model(version: int) -> dict[str, np.ndarray]:
    out = {n: np.full(s, version, np.float32) for n, s in SHAPES.items()}
    out["steps"] = np.full(SHAPES["steps"], version, np.int64)
    return out


def reader_loop(addresses: list[str], name: str, until_version: int, out: Any) -> None:
    reader = WeightsReader(addresses, name, timeout_s=10.0)
    seen: list[int] = []
    mixed: list[str] = []
    have = -1
    deadline = time.monotonic() + 40
    i = 0
    while have < until_version and time.monotonic() < deadline:
        i += 1
        got = reader.wait(have + 1, 2.0) if i % 2 else reader.get(have)
        if got is None:
            continue
        version, tensors = got
        if set(tensors) != set(SHAPES):
            mixed.append(f"v{version}: names {sorted(tensors)}")
        for tname, arr in tensors.items():
            lo, hi = int(arr.min()), int(arr.max())
            if lo != version or hi != version:
                mixed.append(f"v{version}: {tname} holds {lo}..{hi}")
        have = version
        seen.append(version)
    reader.close()
    out.put((name, seen, mixed))


def test_no_reader_ever_mixes_versions() -> None:
    last = 60
    with ShardProcesses(3) as ps:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        readers = [ctx.Process(target=reader_loop, args=(ps.addresses, f"r{i}", last, out)) for i in range(4)]
        for p in readers:
            p.start()
        pub = WeightsPublisher(ps.addresses)
        try:
            for version in range(1, last + 1):
                pub.publish(version, model(version), timeout_s=10)
                if version % 10 == 0:
                    time.sleep(0.05)  # let readers catch up now and then, so some read every version
            results = [out.get(timeout=60) for _ in readers]
        finally:
            pub.close()
            for p in readers:
                p.join(10)
                if p.is_alive():
                    p.kill()
    for name, seen, mixed in results:
        assert not mixed, f"{name} assembled mixed versions: {mixed[:5]}"
        assert seen and seen[-1] == last, f"{name} never reached version {last}: {seen[-5:]}"
        assert seen == sorted(set(seen)), f"{name} went backwards: {seen}"
