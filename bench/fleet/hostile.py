"""Hostile clients against live services: valid inserts from 4 well-behaved writers while a hostile
peer floods replay and the paramserver; does any accepted insert get lost, stored twice, or the
services' memory run away?

    .venv/bin/python -m bench.fleet.hostile [--seconds 8] [--writers 4]

Replay (durability ``wal``, a uniform table) and a paramserver run as real processes
(`rlfleet service`). Each of ``--writers`` processes inserts batches of 64 CartPole-shaped
transitions that name themselves (writer, idx) through ``InsertClient`` for ``--seconds``,
once undisturbed (the reference) and once while a hostile process sends, in a loop:
undecodable frames, headers that break every rule, inserts whose sender ids imitate the
writers' readable names (at seq 2^64-1, or with frames that do not match their header),
inserts from ever new sender ids, oversized single frames (600 MiB: refused as their size arrives), and garbage to
the paramserver. Afterwards replay's write-ahead log is read back.

- ``acked_lost``: inserts a writer was acked for that the log does not hold with the same
  items (goal 0);
- ``duplicates_stored``: (writer, idx) transitions the log holds more than once (goal 0);
- ``valid_throughput_ratio``: the writers' acked inserts/s under attack / undisturbed (goal >= 0.7);
- ``rss_growth_mb``: each service's resident memory after the attack minus before it, from /proc.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from common.wire.codec import PROTOCOL_VERSION

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cartpole-dqn.yaml"
BATCH = 64


def start(service: str, run_dir: Path, sets: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "cli", "service", service, "--config", str(CONFIG)]
    for s in [f"run_dir={run_dir}", "network.bind_host=127.0.0.1", "metrics.port=0", *sets]:
        cmd += ["--set", s]
    log = open(run_dir / f"{service}.log", "ab")  # noqa: SIM115 (the process owns it)
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def batch(writer: int, start_idx: int) -> dict[str, np.ndarray]:
    idx = np.arange(start_idx, start_idx + BATCH, dtype=np.int64)
    obs = np.stack([idx, idx + 1, idx + 2, idx + 3], axis=1).astype(np.float32)
    return {"obs": obs, "action": idx % 2, "reward": np.ones(BATCH, np.float32), "next_obs": obs + 1,
            "discount": np.full(BATCH, 0.99, np.float32), "version": np.zeros(BATCH, np.int64),
            "writer": np.full(BATCH, writer, np.int32), "idx": idx}


def writer_main(address: str, writer: int, phase: int, seconds: float, out: Any) -> None:
    from common.clients.replay_insert import InsertClient

    acked: dict[int, int] = {}
    sender = f"actor-{writer}/{secrets.token_hex(16)}"
    client = InsertClient(address, sender, on_ack=lambda seq, n: acked.__setitem__(seq, n))
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        client.insert("main", batch(writer, (phase * 10_000_000) + i * BATCH))
        i += 1
    client.flush(60)
    client.close()
    out.put((sender, acked))


def hostile_main(replay: str, params: str, stop_at: float, victims: list[str]) -> None:
    ctx = zmq.Context()
    socks = [ctx.socket(zmq.DEALER) for _ in range(2)]
    for s, a in zip(socks, (replay, params), strict=True):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDTIMEO, 1000)
        s.connect(a)
    rng = np.random.default_rng(7)
    good = batch(99, 0)
    arrays = [[k, str(v.dtype), list(v.shape)] for k, v in good.items()]
    frames = [v.tobytes() for v in good.values()]
    big = np.zeros(600 << 20, np.uint8)
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        head = {"v": PROTOCOL_VERSION, "type": "insert", "sender": "", "seq": int(rng.integers(0, 1 << 62)),
                "body": {"table": "main"}, "arrays": arrays}
        kind = n % 6
        try:
            if kind == 0:  # undecodable and rule-breaking headers, to both services
                for s in socks:
                    s.send_multipart([rng.bytes(int(rng.integers(1, 200)))])
                    s.send_multipart([msgpack.packb({**head, "v": "1"})])
            elif kind == 1:  # sender ids that imitate a writer's readable name, seq at the top
                head.update(sender=f"{victims[n % len(victims)]}/{secrets.token_hex(16)}", seq=(1 << 64) - 1)
                socks[0].send_multipart([msgpack.packb(head), *frames])
            elif kind == 2:  # bad content under a writer-like (sender, seq)
                head.update(sender=victims[n % len(victims)], seq=1)
                bad = [*frames[:-1], b"\x00" * (len(frames[-1]) - 1)]
                socks[0].send_multipart([msgpack.packb(head), *bad])
            elif kind == 3:  # ever new sender ids
                head.update(sender=secrets.token_hex(16))
                socks[0].send_multipart([msgpack.packb(head), *frames])
            elif kind == 4 and n % 60 == 4:  # an oversized single frame, now and then
                socks[0].send_multipart([msgpack.packb(head), big.data], copy=False)
            else:  # a publish to the paramserver that breaks the partition
                socks[1].send_multipart([msgpack.packb({"v": PROTOCOL_VERSION, "type": "publish", "sender": "h",
                                                        "seq": n,
                                                        "body": {"version": n, "layout": "x", "num_shards": 1},
                                                        "arrays": [["w", "float32", [4]]]}), b"\x00" * 16])
        except zmq.Again:
            pass
        for s in socks:  # drop whatever comes back
            while s.poll(0):
                s.recv_multipart()
    for s in socks:
        s.close()
    ctx.term()


def run_writers(address: str, writers: int, phase: int, seconds: float) -> dict[str, dict[int, int]]:
    q: Any = mp.get_context("spawn").Queue()
    procs = [mp.get_context("spawn").Process(target=writer_main, args=(address, w, phase, seconds, q))
             for w in range(writers)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join(30)
    return got


def stored(run_dir: Path, writers: int) -> tuple[dict[tuple[str, int], int], int]:
    """(sender, seq) -> items of every insert in the log, and how many of the writers' transitions it
    holds twice (the hostile's own batches, writer 99, are accepted inserts of its own: not counted)."""
    from services.replay.storage import read_log_file

    inserts: dict[tuple[str, int], int] = {}
    seen: Counter[tuple[int, int]] = Counter()
    for path in sorted(run_dir.rglob("wal-*.log")):
        for header, arrays in read_log_file(path):
            if header.get("op") == "insert":
                inserts[(header["sender"], int(header["seq"]))] = len(arrays["idx"])
                mine = arrays["writer"] < writers
                seen.update(zip(arrays["writer"][mine].tolist(), arrays["idx"][mine].tolist(), strict=True))
    return inserts, sum(c - 1 for c in seen.values() if c > 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--writers", type=int, default=4)
    args = ap.parse_args()
    from common.wire.transport import free_tcp_port

    run_dir = Path(tempfile.mkdtemp(prefix="hostile-"))
    replay, params = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    sets = [f"network.replay=[{replay}]", f"network.paramserver=[{params}]", "replay.durability=wal",
            "replay.tables.0.kind=uniform", "replay.tables.0.capacity=4000000", "replay.tables.0.min_size=1",
            "replay.tables.0.samples_per_insert=null", "replay.checkpoint_every_s=3600",
            "replay.tables.0.columns=first_insert"]  # the writers' own columns
    services = {name: start(name, run_dir, sets) for name in ("replay", "paramserver")}
    try:
        time.sleep(6.0)  # both up (the writers' clients wait for replay anyway)
        quiet = run_writers(replay, args.writers, 0, args.seconds)
        before = {name: rss_mb(p.pid) for name, p in services.items()}
        stop_at = time.monotonic() + args.seconds + 5
        hostile = mp.get_context("spawn").Process(
            target=hostile_main, args=(replay, params, stop_at, [f"actor-{w}" for w in range(args.writers)]))
        hostile.start()
        attacked = run_writers(replay, args.writers, 1, args.seconds)
        hostile.join(60)
        after = {name: rss_mb(p.pid) for name, p in services.items()}
        alive = {name: p.poll() is None for name, p in services.items()}
        held, twice = stored(run_dir, args.writers)  # before the stop: a final snapshot may retire log segments
    finally:
        for p in services.values():
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    acked = {(s, seq): n for phase in (quiet, attacked) for s, log in phase.items() for seq, n in log.items()}
    lost = sum(1 for key, n in acked.items() if held.get(key) != n)
    rate = {name: sum(len(log) for log in phase.values()) / args.seconds
            for name, phase in (("quiet", quiet), ("attacked", attacked))}
    print(json.dumps({
        "writers": args.writers, "seconds": args.seconds, "acked_inserts": len(acked),
        "acked_lost": lost, "duplicates_stored": twice,
        "valid_inserts_per_s": {k: round(v, 1) for k, v in rate.items()},
        "valid_throughput_ratio": round(rate["attacked"] / rate["quiet"], 3) if rate["quiet"] else None,
        "rss_growth_mb": {k: round(after[k] - before[k], 1) for k in before},
        "services_alive": alive,
    }))


if __name__ == "__main__":
    main()
