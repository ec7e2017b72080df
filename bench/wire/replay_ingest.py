"""Replay ingest: acked transitions per second into a replay server, vs raw PUSH->PULL.

    .venv/bin/python -m bench.wire.replay_ingest [--quick]

Writers (1, 2, 4 processes) send CartPole transitions (obs 4 x f32, action
i64, reward f32, next_obs 4 x f32, done bool, discount f32) in batches of 64
and 256 to one replay server process through ``InsertClient`` with the config's
defaults, as an actor does (``actor.max_unacked`` window, ``actor.coalesce_inserts``:
inserts made while others are in flight go merged into one message): encode,
send, and wait for every ack. The time runs from
the moment all writers are released until the last writer has all its acks.

The ceiling, side by side in the same run: the same writer processes push the
same encoded insert bytes (encoded once, by the very function InsertClient
encodes with: header and one packed payload frame) through a raw pyzmq PUSH
socket to a PULL process that only receives them; its time ends when the
last message is received. Two extra figures: 4 writers, batch 256, into a server with ``wal``
durability (fsync per burst); and 1 writer, batch 256, into a ``prioritized``
table with a priority per transition, as actors insert into the example configs
(the ratio's cases use a ``uniform`` table and no priorities).

Every case sends the same number of messages for ours and the ceiling: 20,000
of batch 64 and 8,000 of batch 256 (a quarter with ``--quick``), so that even
the ceiling's fastest case runs for a fifth of a second and a run's ratio is
not a matter of a few milliseconds.

Before the clock starts, every case sends a warm-up lap, timed on its own: as
many messages as fill the table once (1,000,000 transitions; the ceiling sends
the same count). A table's columns are allocated at its first insert and
untouched, so its first lap writes to memory the kernel hands over a page at a
time at the first write: ~90 ms for the 49 MB of a CartPole table here (7.5 us
a 4 KiB page; 1.4 ms to write the same bytes again), half the time of the
timed part of a batch-256 case, paid once in a server's life (a background
thread populates pages ahead of the writes, services/replay/prefault.py, but on
2 busy cores it competes with the writers). The warm-up's rates are reported
as ``first_lap`` beside the steady ones.

``memory``: the first write to fresh memory (allocated as a table's columns are) against writing it
again, in GB/s, measured before the cases; ``first_lap.table_first_touch_ms``: what the table's first
lap pays for its memory at that speed. On this project's VMs free memory goes back to the host
(virtio-balloon free page reporting), and a first touch waits for the host to back each page: ~0.5
GB/s against ~40 GB/s for a rewrite, ~100 ms for a 49 MB table, while the ceiling writes nothing. A
server started right after another one exited may get pages the host still backs (first touch ~20
GB/s): the first lap's figure moves with that.

Every case runs ``--repeats`` times (3; once with ``--quick``), each repeat
running ours right before its ceiling: the figures are medians over the
repeats and a writer count's ratio is the median of its repeats' ratios (the
ceiling alone varied 13-23 M transitions/s between runs minutes apart).

Last line: JSON with transitions/s for every case after the warm-up (medians),
the warm-up lap's (``first_lap``), ``ratio_b256`` per writer count (ours /
ceiling after the warm-up, median over the repeats; each repeat's in
``ratio_b256_runs``), and ``ratio``: their geometric mean.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import threading
import time
from typing import Any

import numpy as np
import zmq

from rlfleet.common.config import ActorConfig, ReplayConfig, TableConfig
from rlfleet.common.memory import keep_freed_memory
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.inserts import InsertEncoder
from rlfleet.common.wire.transport import make_socket

CTX = mp.get_context("spawn")
CAPACITY = 1_000_000  # of the server's table; the warm-up lap fills it once


def cartpole(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    obs = rng.standard_normal((n, 4)).astype(np.float32)
    return {"obs": obs, "action": rng.integers(0, 2, n).astype(np.int64), "reward": np.ones(n, np.float32),
            "next_obs": obs + 0.01, "done": np.zeros(n, bool), "discount": np.full(n, 0.99, np.float32)}


def _server(durability: str, directory: str, addr_q: Any, stop: Any, kind: str = "uniform") -> None:
    keep_freed_memory()  # as every service does (common/memory.py); both sides alike
    from rlfleet.services.replay.server import ReplayServer

    cfg = ReplayConfig(tables=[TableConfig(name="main", kind=kind, capacity=CAPACITY, min_size=1)],  # type: ignore[arg-type]
                       durability=durability, checkpoint_every_s=3600)  # type: ignore[arg-type]
    srv = ReplayServer(cfg, ServiceMetrics("replay"), "tcp://127.0.0.1:0", directory=directory)
    addr_q.put(srv.endpoint)
    def stop_on_request() -> None:
        stop.wait()
        srv.stop()

    threading.Thread(target=stop_on_request, daemon=True).start()
    srv.serve()
    srv.close()


def _pull(warm: int, total: int, addr_q: Any, warm_q: Any, result_q: Any) -> None:
    keep_freed_memory()  # as every service does (common/memory.py); both sides alike
    sock = make_socket(zmq.PULL, bind="tcp://127.0.0.1:0", hwm=1000)
    addr_q.put(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    for _ in range(warm):
        sock.recv_multipart(copy=False)
    warm_q.put(time.time())
    for _ in range(total):
        sock.recv_multipart(copy=False)
    result_q.put(time.time())
    sock.close()


def _writer(mode: str, addr: str, index: int, n_warm: int, n_msgs: int, batch: int, warm: Any, start: Any,
            done: Any, warm_q: Any, result_q: Any) -> None:
    keep_freed_memory()  # as every service does (common/memory.py); both sides alike
    cols = cartpole(batch)
    if mode == "raw":
        sock = make_socket(zmq.PUSH, connect=addr, hwm=1000)
        # exactly the frames InsertClient sends (its encoder)
        frames = InsertEncoder().frames("main", cols, f"w{index}-{time.time_ns()}", time.time_ns() // 1000, 1)
        warm.wait()
        for _ in range(n_warm):
            sock.send_multipart(frames, copy=False)
        start.wait()
        for _ in range(n_msgs):
            sock.send_multipart(frames, copy=False)
        done.wait(60)  # linger is 0: stay until the receiver has everything
        sock.close()
        result_q.put(time.time())
        return
    from rlfleet.common.clients.replay_insert import InsertClient

    defaults = ActorConfig()
    client = InsertClient(addr, f"w{index}-{time.time_ns()}", max_unacked=defaults.max_unacked,
                          coalesce=defaults.coalesce_inserts)
    priorities = np.random.default_rng(index).uniform(0.1, 2.0, batch) if mode == "prioritized" else None
    warm.wait()
    for _ in range(n_warm):
        client.insert("main", cols, priorities, timeout_s=60)
    client.flush(60)
    warm_q.put(time.time())
    start.wait()
    for _ in range(n_msgs):
        client.insert("main", cols, priorities, timeout_s=60)
    client.flush(60)
    result_q.put(time.time())
    client.close()


def run_case(mode: str, writers: int, batch: int, total_msgs: int) -> tuple[float, float]:
    """Transitions per second for one case: after the warm-up lap, and in it."""
    per = total_msgs // writers
    total_msgs = per * writers
    warm_per = -(-CAPACITY // (batch * writers))  # the warm-up lap fills the table once
    warm_msgs = warm_per * writers
    addr_q, warm_q, result_q = CTX.Queue(), CTX.Queue(), CTX.Queue()
    warm, start, done, stop = CTX.Event(), CTX.Event(), CTX.Event(), CTX.Event()
    tmp = tempfile.TemporaryDirectory(prefix="rlfleet-bench-")
    if mode == "raw":
        receiver = CTX.Process(target=_pull, args=(warm_msgs, total_msgs, addr_q, warm_q, result_q))
    else:
        receiver = CTX.Process(target=_server, args=("wal" if mode == "wal" else "memory", tmp.name, addr_q, stop,
                                                     "prioritized" if mode == "prioritized" else "uniform"))
    receiver.start()
    addr = addr_q.get(timeout=60)
    procs = [CTX.Process(target=_writer, args=(mode, addr, i, warm_per, per, batch, warm, start, done, warm_q,
                                               result_q))
             for i in range(writers)]
    for p in procs:
        p.start()
    time.sleep(1.0 + 0.3 * writers)  # let every writer import, connect and encode
    t_warm = time.time()
    warm.set()
    if mode == "raw":
        warm_end = warm_q.get(timeout=120)
    else:
        warm_end = max(warm_q.get(timeout=120) for _ in procs)
    t0 = time.time()
    start.set()
    if mode == "raw":
        t_end = result_q.get(timeout=120)  # the receiver's time comes first
        done.set()
        for _ in procs:
            result_q.get(timeout=60)
    else:
        t_end = max(result_q.get(timeout=120) for _ in procs)
        stop.set()
    for p in [*procs, receiver]:
        p.join(30)
    tmp.cleanup()
    return total_msgs * batch / (t_end - t0), warm_msgs * batch / (warm_end - t_warm)


def first_touch(nbytes: int = 128 << 20) -> dict[str, float]:
    """GB/s of the first write to fresh memory allocated as a table's columns are (``lazy_zeros``: anonymous,
    huge pages advised), one byte a 4 KiB page, against writing all of it again. On a VM whose free memory
    goes back to the host (virtio-balloon free page reporting) the first touch waits for the host to back
    each page: what a table's first lap pays and a receiver that writes nothing does not."""
    from rlfleet.services.replay.prefault import lazy_zeros

    a = lazy_zeros((nbytes,), np.uint8)
    t0 = time.perf_counter()
    a[::4096] = 1
    t1 = time.perf_counter()
    a[:] = 2
    t2 = time.perf_counter()
    return {"first_touch_gb_per_s": round(nbytes / (t1 - t0) / 1e9, 2),
            "rewrite_gb_per_s": round(nbytes / (t2 - t1) / 1e9, 2)}


def table_bytes() -> int:
    """Bytes of the cases' table columns (CAPACITY CartPole transitions)."""
    return CAPACITY * sum(a.itemsize * (a.size // len(a)) for a in cartpole(1).values())


def median(values: list[float]) -> float:
    return float(np.median(values))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every case (medians reported); 1 with --quick")
    a = ap.parse_args()
    if a.repeats < 1:
        ap.error(f"--repeats={a.repeats}; allowed: >= 1")
    scale, repeats = (0.25, 1) if a.quick else (1.0, a.repeats)
    memory = first_touch()  # before any case: this process's memory is as fresh as a new server's
    runs: dict[str, list[tuple[float, float]]] = {}  # case -> (steady, first lap) of every run
    # each repeat runs every case once, ours right before its ceiling, so that a ratio compares
    # runs minutes apart at most on a machine whose speed drifts
    for rep in range(repeats):
        for batch in (64, 256):
            msgs = int((20_000 if batch == 64 else 8000) * scale)
            for writers in (1, 2, 4):
                for mode in ("ours", "raw"):
                    tps, first = run_case(mode, writers, batch, msgs)
                    runs.setdefault(f"{mode}_w{writers}_b{batch}", []).append((tps, first))
                    print(f"[{rep + 1}/{repeats}] {mode:5s} writers={writers} batch={batch}: {tps:,.0f} transitions/s "
                          f"(first lap {first:,.0f})", flush=True)
        for mode, writers in (("wal", 4), ("prioritized", 1)):
            tps, first = run_case(mode, writers, 256, int(8000 * scale))
            runs.setdefault(f"ours_{mode}_w{writers}_b256", []).append((tps, first))
            print(f"[{rep + 1}/{repeats}] {mode} writers={writers} batch=256: {tps:,.0f} transitions/s "
                  f"(first lap {first:,.0f})", flush=True)
    out: dict[str, Any] = {"unit": "transitions/s", "repeats": repeats, "ours": {}, "raw": {},
                           "first_lap": {"ours": {}, "raw": {}}}
    for case, results in runs.items():
        mode, key = case.split("_", 1)
        steady, first = median([r[0] for r in results]), median([r[1] for r in results])
        if mode in ("ours", "raw") and not key.startswith(("wal", "prioritized")):
            out[mode][key], out["first_lap"][mode][key] = round(steady), round(first)
        else:
            out[case], out["first_lap"][case] = round(steady), round(first)
    ratios, cold = {}, {}
    for w in (1, 2, 4):
        pairs = list(zip(runs[f"ours_w{w}_b256"], runs[f"raw_w{w}_b256"], strict=True))
        ratios[f"w{w}"] = median([o[0] / r[0] for o, r in pairs])
        cold[f"w{w}"] = median([o[1] / r[1] for o, r in pairs])
        out.setdefault("ratio_b256_runs", {})[f"w{w}"] = [round(o[0] / r[0], 3) for o, r in pairs]
    out["ratio_b256"] = {k: round(v, 3) for k, v in ratios.items()}
    out["ratio"] = round(float(np.exp(np.mean(np.log(list(ratios.values()))))), 3)
    out["first_lap"]["ratio"] = round(float(np.exp(np.mean(np.log(list(cold.values()))))), 3)
    # what the first lap's fresh table memory costs at this machine's first-touch speed
    out["first_lap"]["table_mb"] = round(table_bytes() / 1e6, 1)
    out["first_lap"]["table_first_touch_ms"] = round(table_bytes() / (memory["first_touch_gb_per_s"] * 1e9) * 1e3, 1)
    out["memory"] = memory
    print(json.dumps(out))


if __name__ == "__main__":
    main()
