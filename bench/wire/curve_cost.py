"""What CurveZMQ costs: the same traffic with security.mode none (the reference) and curve, side by side.

    .venv/bin/python -m bench.wire.curve_cost [--seconds S]

- replay ingest: one actor's InsertClient (the config's window, 64 CartPole
  transitions each) into a replay process for S seconds: transitions/s acked.
- weight sync: the learner's WeightsPublisher publishes a 1.2M-parameter model
  (4.8 MB) to a paramserver process and an actor's WeightsReader fetches it
  over tcp (shared memory off, as for readers on other hosts): ms per
  publish + fetch, median and p90 of 30.

Servers are real processes (`rlfleet service`), clients use the keys
`rlfleet keys` makes. Last line: JSON with both modes and ``ratio`` (curve /
none) for each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.common import config
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.security import client_curve, make_keys
from rlfleet.common.wire.transport import free_tcp_port

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cartpole-dqn.yaml"


def start(name: str, sets: list[str], log: Path) -> subprocess.Popen[bytes]:
    port = free_tcp_port()
    cmd = [sys.executable, "-m", "rlfleet.cli", "service", name, "--config", str(CONFIG), "--log-level", "WARNING",
           "--set", "metrics.host=127.0.0.1", "--set", f"metrics.port={port}"]
    for s in sets:
        cmd += ["--set", s]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out,
                                stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return proc
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def batch(n: int, start_idx: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(start_idx)
    obs = rng.standard_normal((n, 4)).astype(np.float32)
    return {"obs": obs, "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
            "next_obs": obs + 0.01, "done": np.zeros(n, bool)}


def ingest(cfg: config.Experiment, seconds: float) -> float:
    batches = [batch(64, i) for i in range(16)]
    with InsertClient.from_config(cfg, 0, f"bench-{time.time_ns()}") as ic:
        ic.insert("main", batches[0], timeout_s=30)
        ic.flush(30)  # connected (and, with curve, through the handshake) before the clock starts
        first = ic.items_acked
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < seconds:
            ic.insert("main", batches[i % len(batches)], timeout_s=30)
            i += 1
        ic.flush(30)
        return (ic.items_acked - first) / (time.monotonic() - t0)


def weight_sync(cfg: config.Experiment, rounds: int = 30) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    model = {"fc.w": rng.standard_normal((512, 2176)).astype(np.float32),
             "conv.w": rng.standard_normal((64, 64, 3, 3)).astype(np.float32),
             "head.w": rng.standard_normal((18, 512)).astype(np.float32)}
    pub = WeightsPublisher(cfg.network.paramserver, "learner", curve=client_curve(cfg, "learner"))
    reader = WeightsReader(cfg.network.paramserver, "actor-0", curve=client_curve(cfg, "actor"), shm=False,
                           timeout_s=30)
    times = []
    try:
        for v in range(1, rounds + 2):
            t0 = time.perf_counter()
            pub.publish(v, model, timeout_s=30)
            got = reader.get(v - 1, timeout_s=30)
            assert got is not None and got[0] == v
            if v > 1:  # the first round pays the handshakes
                times.append((time.perf_counter() - t0) * 1000)
    finally:
        pub.close()
        reader.close()
    return float(np.median(times)), float(np.percentile(times, 90))


def run_mode(mode: str, tmp: Path, seconds: float) -> dict[str, float]:
    sets = [f"network.replay=[tcp://127.0.0.1:{free_tcp_port()}]",
            f"network.paramserver=[tcp://127.0.0.1:{free_tcp_port()}]", "network.bind_host=127.0.0.1",
            "replay.tables.0.samples_per_insert=null", "replay.tables.0.kind=uniform", f"run_dir={tmp / mode}",
            "replay.tables.0.columns=first_insert"]
    if mode == "curve":
        make_keys(tmp / "keys", force=True)
        sets += ["security.mode=curve", f"security.keys_dir={tmp / 'keys'}"]
    cfg = config.load(CONFIG, sets, environ={})
    procs = [start("replay", sets, tmp / f"replay-{mode}.log"), start("paramserver", sets, tmp / f"ps-{mode}.log")]
    try:
        tps = ingest(cfg, seconds)
        p50, p90 = weight_sync(cfg)
    finally:
        for p in procs:
            stop(p)
    return {"insert_transitions_per_s": round(tps), "weights_1m2_p50_ms": round(p50, 2),
            "weights_1m2_p90_ms": round(p90, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="ingest time per mode")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlfleet-curve-") as d:
        tmp = Path(d)
        out: dict[str, Any] = {}
        for mode in ("none", "curve"):
            out[mode] = run_mode(mode, tmp, args.seconds)
            print(mode, out[mode], flush=True)
    out["ratio"] = {k: round(out["curve"][k] / out["none"][k], 3) for k in out["none"]}
    print(json.dumps({"bench": "curve_cost", **out}))


if __name__ == "__main__":
    main()
