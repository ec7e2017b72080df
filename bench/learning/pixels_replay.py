"""The replay-facing figures of bench.learning.pixels: ingest of packed Pong inserts against raw PUSH/PULL, and
CNN updates through replay against the same learner in process (see bench/learning/pixels.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import torch
import zmq

from bench.learning.pixels_data import CTX, chunks, pong_config
from rlfleet.common.config import ActorConfig, ReplayConfig, TableConfig
from rlfleet.common.envs import probe_env
from rlfleet.common.memory import keep_freed_memory


# -- ingest -------------------------------------------------------------------
def _stop_when_set(stop: Any, srv: Any) -> None:
    stop.wait()
    srv.stop()


def _server(addr_q: Any, stop: Any, capacity: int) -> None:
    keep_freed_memory()  # as every service does (common/memory.py); both sides alike
    from rlfleet.common.metrics import ServiceMetrics
    from rlfleet.services.replay.server import ReplayServer

    cfg = ReplayConfig(tables=[TableConfig(name="main", kind="prioritized", capacity=capacity, min_size=1)])
    srv = ReplayServer(cfg, ServiceMetrics("replay"), "tcp://127.0.0.1:0", max_held_bytes=1 << 30)
    addr_q.put(srv.endpoint)
    threading.Thread(target=_stop_when_set, args=(stop, srv), daemon=True).start()
    srv.serve()
    srv.close()


def _pull(total: int, addr_q: Any, result_q: Any) -> None:
    keep_freed_memory()  # as every service does (common/memory.py); both sides alike
    from rlfleet.common.wire.transport import make_socket

    sock = make_socket(zmq.PULL, bind="tcp://127.0.0.1:0", hwm=100)
    addr_q.put(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    sock.recv_multipart(copy=False)
    t0 = time.monotonic()
    for _ in range(total - 1):
        sock.recv_multipart(copy=False)
    result_q.put(("seconds", time.monotonic() - t0))
    sock.close()


def _writer(mode: str, addr: str, batches: list[dict[str, np.ndarray]], msgs: int, result_q: Any) -> None:
    keep_freed_memory()  # as every service does (common/memory.py); both sides alike
    from rlfleet.common.wire.frames import pack_frames
    from rlfleet.common.wire.inserts import InsertEncoder

    batches = [pack_frames(b) for b in batches]  # as InsertClient sends them (packed once here, not timed)
    encoded = [InsertEncoder().frames("main", b, "bench-writer", 1, 1) for b in batches]
    nbytes = sum(sum(len(memoryview(f)) for f in e) for e in encoded) / len(encoded)
    if mode == "raw":
        from rlfleet.common.wire.transport import make_socket

        sock = make_socket(zmq.PUSH, connect=addr, hwm=100)
        for i in range(msgs):
            sock.send_multipart(encoded[i % len(encoded)], copy=False)
        time.sleep(2.0)  # linger 0: stay until the receiver has everything
        sock.close()
        result_q.put(("bytes", nbytes))
        return
    from rlfleet.common.clients.replay_insert import InsertClient

    client = InsertClient(addr, f"bench-{time.time_ns()}", max_unacked=ActorConfig().max_unacked, pack_frames=False)
    client.insert("main", batches[0], timeout_s=60)
    client.flush(60)
    t0 = time.monotonic()
    for i in range(1, msgs):
        client.insert("main", batches[i % len(batches)], timeout_s=60)
    client.flush(120)
    result_q.put(("bytes", nbytes))
    result_q.put(("seconds", time.monotonic() - t0))
    client.close()


def ingest(mode: str, batches: list[dict[str, np.ndarray]], msgs: int, capacity: int) -> float:
    """MB/s of encoded insert bytes: acked by replay (``ours``), or received by a PULL (``raw``)."""
    addr_q, result_q, stop = CTX.Queue(), CTX.Queue(), CTX.Event()
    receiver = CTX.Process(target=_pull, args=(msgs, addr_q, result_q)) if mode == "raw" else \
        CTX.Process(target=_server, args=(addr_q, stop, capacity))
    receiver.start()
    addr = addr_q.get(timeout=60)
    writer = CTX.Process(target=_writer, args=(mode, addr, batches, msgs, result_q))
    writer.start()
    got = dict(result_q.get(timeout=300) for _ in range(2))
    stop.set()
    writer.join(30)
    receiver.join(30)
    return float(got["bytes"] * (msgs - 1) / got["seconds"] / 1e6)


# -- learner ------------------------------------------------------------------
def _sampled_server(addr_q: Any, stop: Any, data: dict[str, np.ndarray]) -> None:
    keep_freed_memory()  # as every service does (common/memory.py); both sides alike
    from rlfleet.common.metrics import ServiceMetrics
    from rlfleet.services.replay.server import ReplayServer

    cfg = ReplayConfig(tables=[TableConfig(name="main", kind="prioritized", capacity=len(data["obs"]),
                                           min_size=1)])
    srv = ReplayServer(cfg, ServiceMetrics("replay"), "tcp://127.0.0.1:0")
    for part in chunks(data, 64):
        srv.tables["main"].insert(part)
    addr_q.put(srv.endpoint)
    threading.Thread(target=_stop_when_set, args=(stop, srv), daemon=True).start()
    srv.serve()
    srv.close()


def updates_per_s(mode: str, data: dict[str, np.ndarray], seconds: float, threads: int) -> float:
    from rlfleet.common import algorithms
    from rlfleet.common.clients.replay_sample import SampleClient

    cfg = pong_config()
    torch.set_num_threads(threads)
    obs_space, act_space = probe_env(cfg)
    learner = algorithms.get("dqn").make_learner(cfg.algorithm, obs_space, act_space, device="auto", seed=0)
    batch_size = cfg.algorithm.batch_size
    if mode == "inproc":
        rng = np.random.default_rng(0)
        n, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            idx = rng.integers(0, len(data["obs"]), batch_size)
            learner.learn({k: v[idx] for k, v in data.items()})
            n += 1
        return n / (time.monotonic() - start)
    addr_q, stop = CTX.Queue(), CTX.Event()
    server = CTX.Process(target=_sampled_server, args=(addr_q, stop, data))
    server.start()
    try:
        with SampleClient([addr_q.get(timeout=120)], "bench-learner", "main", batch_size,
                          in_flight=cfg.learner.samples_in_flight) as client:
            client.sample(timeout_s=60)
            n, start = 0, time.monotonic()
            while time.monotonic() - start < seconds:
                batch = client.sample(timeout_s=60)
                _, priorities = learner.learn(batch.data, learner.weigh(batch.probability))
                if priorities is not None:
                    client.update_priorities(batch, priorities)
                n += 1
            return n / (time.monotonic() - start)
    finally:
        stop.set()
        server.join(30)
