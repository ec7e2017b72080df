"""Gradient pushes applied per second through one paramserver shard, against a raw round trip.

    .venv/bin/python -m bench.wire.gradient_push [--seconds 5]

One shard process (Adam on its slice), one client process pushing the same
gradients again and again with ``GradientPusher.push`` (one push in flight, as
a worker: it waits for the ack), for two models: A3C's CartPole network
(4-64-64 shared torso, 2 + 1 heads: 4.6k parameters) and the 1.2M-parameter
conv network of bench.wire.weight_sync. Each push is checked (layout, names,
shapes, finite values), applied by the optimizer and kept as a new version.

The ceiling, in the same run for each model: a raw pyzmq DEALER sending the
same bytes (one frame a tensor, zero-copy) to a ROUTER process that answers
each with one small frame, one round trip in flight. ``ratio`` = pushes/s /
raw round trips/s (the issue's goal: >= 0.7).

Last line: JSON with pushes/s, raw round trips/s and the ratio for each model.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from typing import Any

import numpy as np
import zmq

from bench.wire.weight_sync import conv_1m2, make
from harness.paramserver_procs import ShardProcesses
from rlfleet.common.clients.gradient_pusher import GradientPusher
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.wire.transport import free_tcp_port


def a3c_cartpole() -> dict[str, tuple[int, ...]]:
    return {"torso.0.weight": (64, 4), "torso.0.bias": (64,), "torso.2.weight": (64, 64), "torso.2.bias": (64,),
            "pi.weight": (2, 64), "pi.bias": (2,), "v.weight": (1, 64), "v.bias": (1,)}


MODELS = {"a3c_cartpole_4.6k": a3c_cartpole, "conv_1.2M": conv_1m2}


def _push_loop(address: str, model: str, seconds: float, out: Any) -> None:
    grads = {n: np.full_like(a, 1e-3) for n, a in make(MODELS[model]()).items()}
    pusher = GradientPusher([address], f"bench/{model}")
    version = 0
    for _ in range(20):  # warm-up
        version = pusher.push(version, grads).version
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        result = pusher.push(version, grads)
        assert result.complete, result.refused
        version = result.version
        n += 1
    out.put(n / (time.perf_counter() - start))
    pusher.close()


def pushes_per_s(model: str, seconds: float) -> float:
    sets = [f"run_dir={tempfile.mkdtemp(prefix='gradient-push-')}", "paramserver.gradients.optimizer=adam",
            "paramserver.gradients.max_staleness=1000000", "paramserver.gradients.checkpoint_every_s=3600"]
    with ShardProcesses(1, extra_sets=sets) as shards:
        WeightsPublisher(shards.addresses).publish(0, make(MODELS[model]()))
        q: Any = mp.get_context("spawn").Queue()
        proc = mp.get_context("spawn").Process(target=_push_loop, args=(shards.addresses[0], model, seconds, q))
        proc.start()
        rate = float(q.get(timeout=seconds + 120))
        proc.join(30)
        return rate


def _raw_server(port: int) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{port}")
    while True:
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 2 and frames[1].bytes == b"stop":
            break
        sock.send_multipart([frames[0], b"ok"])
    sock.close(0)
    ctx.term()


def raw_round_trips_per_s(model: str, seconds: float) -> float:
    port = free_tcp_port()
    server = mp.get_context("spawn").Process(target=_raw_server, args=(port,))
    server.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{port}")
    frames: list[Any] = [b"header"] + [np.ascontiguousarray(a) for a in make(MODELS[model]()).values()]
    for _ in range(20):
        sock.send_multipart(frames, copy=False)
        sock.recv()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sock.send_multipart(frames, copy=False)
        sock.recv()
        n += 1
    rate = n / (time.perf_counter() - start)
    sock.send(b"stop")
    sock.close(0)
    ctx.term()
    server.join(10)
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    result: dict[str, Any] = {"seconds": args.seconds, "optimizer": "adam"}
    for model in MODELS:
        raw = raw_round_trips_per_s(model, args.seconds)
        ours = pushes_per_s(model, args.seconds)
        result[model] = {"pushes_per_s": round(ours, 1), "raw_round_trips_per_s": round(raw, 1),
                         "ratio": round(ours / raw, 3)}
        print(model, json.dumps(result[model]), flush=True)
    result["ratio"] = result["a3c_cartpole_4.6k"]["ratio"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
