"""Prioritized replay: sample(256) + priority update(256) cycles per second on 1,000,000 transitions.

    .venv/bin/python -m bench.wire.replay_sample [--quick]

In-process: a PrioritizedTable of 1M CartPole transitions (alpha 0.6), one
cycle = ``sample(256)`` then ``update_priorities`` of those keys.
Over the socket: a replay server process holding the same table (filled
through InsertClient), and a SampleClient with 4 requests in flight; one
cycle = ``sample()`` then ``update_priorities`` (fire and forget,
acks counted). The in-process figure is the ceiling of the socket one.

Last line: JSON with ``inproc_cycles_per_s``, ``socket_cycles_per_s`` and
their ratio.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import numpy as np

from bench.wire.replay_ingest import CTX, cartpole
from rlfleet.common.config import ReplayConfig, TableConfig
from rlfleet.common.metrics import ServiceMetrics

CAPACITY = 1_000_000
BATCH = 256


def table_config() -> TableConfig:
    return TableConfig(name="main", kind="prioritized", capacity=CAPACITY, alpha=0.6, min_size=1)


def inproc(seconds: float) -> float:
    from rlfleet.services.replay.tables import PrioritizedTable

    table = PrioritizedTable(table_config(), np.random.default_rng(0))
    chunk = cartpole(100_000)
    rng = np.random.default_rng(1)
    for _ in range(CAPACITY // 100_000):
        table.insert(chunk, rng.random(100_000) + 0.01)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        s = table.sample(BATCH)
        table.update_priorities(s.keys, rng.random(BATCH) + 0.01)
        n += 1
    return n / (time.perf_counter() - t0)


def _server(addr_q: Any, stop: Any) -> None:
    from rlfleet.services.replay.server import ReplayServer

    srv = ReplayServer(ReplayConfig(tables=[table_config()]), ServiceMetrics("replay"), "tcp://127.0.0.1:0")
    addr_q.put(srv.endpoint)
    def stop_on_request() -> None:
        stop.wait()
        srv.stop()

    threading.Thread(target=stop_on_request, daemon=True).start()
    srv.serve()
    srv.close()


def over_socket(seconds: float, in_flight: int) -> tuple[float, dict[str, Any]]:
    from rlfleet.common.clients.replay_insert import InsertClient
    from rlfleet.common.clients.replay_sample import SampleClient

    addr_q, stop = CTX.Queue(), CTX.Event()
    proc = CTX.Process(target=_server, args=(addr_q, stop))
    proc.start()
    addr = addr_q.get(timeout=60)
    rng = np.random.default_rng(1)
    chunk = cartpole(16_384)
    with InsertClient(addr, "filler", max_unacked=4) as ic:
        for _ in range(-(-CAPACITY // 16_384)):
            ic.insert("main", chunk, rng.random(16_384) + 0.01, timeout_s=60)
        ic.flush(60)
    sc = SampleClient([addr], "learner", "main", BATCH, in_flight=in_flight, seed=0)
    for _ in range(20):  # warm up
        sc.update_priorities(sc.sample(timeout_s=30), rng.random(BATCH) + 0.01)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        b = sc.sample(timeout_s=30)
        sc.update_priorities(b, rng.random(BATCH) + 0.01)
        n += 1
    rate = n / (time.perf_counter() - t0)
    sc.poll(0.5)
    stats = {"priorities_sent": sc.priorities_sent, "priorities_acked": sc.priorities_acked}
    sc.close()
    stop.set()
    proc.join(30)
    return rate, stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    seconds = 2.0 if a.quick else 6.0
    ip = inproc(seconds)
    print(f"in-process: {ip:,.0f} cycles/s", flush=True)
    sock, stats = over_socket(seconds, in_flight=4)
    print(f"socket (4 in flight): {sock:,.0f} cycles/s; {stats}", flush=True)
    print(json.dumps({"table_size": CAPACITY, "batch": BATCH, "inproc_cycles_per_s": round(ip),
                      "socket_cycles_per_s": round(sock), "ratio": round(sock / ip, 3), **stats}))


if __name__ == "__main__":
    main()
