"""Data-parallel learners: samples learned per second for 1 and 2 learner ranks, and the all-reduce's cost.

    .venv/bin/python -m bench.learning.learners [--algo dqn] [--batch 512] [--hidden 256] [--updates 300] [--threads 1]

Each configuration runs real learner processes in one gloo process group (the learner service's
``learners: N``), each rank learning from its share of a fixed global batch (pre-sampled arrays,
as the learner service hands them over: replay is not in this figure) with ``--threads`` torch
threads per rank; also one rank with ``--threads x 2`` threads, what the same two cores give
without a group. ``throughput``: samples learned per second (updates/s x global batch).

In the same 2-rank run, the all-reduce of our update (``GradientAverager.average``: every
gradient flattened into one buffer, one ``all_reduce``, the mean unflattened) against a raw
``torch.distributed.all_reduce`` of a buffer of the same bytes on the same group: 21 pairs of
rounds of 100 calls each side, back to back, each side first in every other pair;
``allreduce_overhead_ratio`` = the median of the pairs' ours / raw (goal <= 1.2), and
``ours_allreduce_ms`` / ``raw_allreduce_ms`` each side's median round.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import numpy as np

from rlfleet.common.wire.transport import free_tcp_port


def make_core(algo: str, batch: int, hidden: int, world: int, averager: Any = None) -> Any:
    import gymnasium as gym

    from rlfleet.common import algorithms

    if algo == "sac":
        from rlfleet.common.algorithms.sac.config import SACConfig

        env = gym.make("Pendulum-v1")
        cfg: Any = SACConfig(batch_size=batch // world, hidden=[hidden, hidden])
    else:
        from rlfleet.common.algorithms.dqn.config import DQNConfig

        env = gym.make("CartPole-v1")
        cfg = DQNConfig(batch_size=batch // world, hidden=[hidden, hidden])
    return algorithms.get(algo).make_learner(cfg, env.observation_space, env.action_space, device="cpu", seed=0,
                                             averager=averager)


def batch_for(algo: str, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    obs = 3 if algo == "sac" else 4
    return {"obs": rng.normal(size=(n, obs)).astype(np.float32),
            "action": (rng.uniform(-2, 2, (n, 1)).astype(np.float32) if algo == "sac" else rng.integers(2, size=n)),
            "reward": rng.normal(size=n).astype(np.float32),
            "next_obs": rng.normal(size=(n, obs)).astype(np.float32),
            "discount": np.full(n, 0.99, np.float32), "version": np.zeros(n, np.int64)}


# The all-reduce comparison: ROUNDS pairs of CALLS calls each side. One pair's two rounds run back to
# back (~0.1 s each), so a pair's ratio holds while the machine's speed drifts: on 2 busy cores a
# round of the raw all-reduce alone took 0.65 to 2.4 ms a call between rounds seconds apart.
ROUNDS, CALLS = 21, 100


def rank_main(args: argparse.Namespace) -> None:
    """One rank: timed updates, then (2 ranks) our all-reduce against the raw one."""
    import torch

    torch.set_num_threads(args.threads)
    averager = None
    if args.world > 1:
        import torch.distributed as dist

        from rlfleet.common.algorithms.data_parallel import GradientAverager

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                                world_size=args.world, timeout=timedelta(seconds=120))
        averager = GradientAverager()
    core = make_core(args.algo, args.batch, args.hidden, args.world, averager)
    rng = np.random.default_rng(args.rank)
    batches = [batch_for(args.algo, args.batch // args.world, rng) for _ in range(8)]
    out: dict[str, Any] = {}
    for i in range(30):  # warm-up
        core.learn(batches[i % len(batches)])
    if args.world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.updates):
        core.learn(batches[i % len(batches)])
    out["updates_per_s"] = args.updates / (time.perf_counter() - t0)
    if args.world > 1:
        grads, _, _ = core.compute_gradients(batches[0])
        raw = torch.zeros(sum(g.numel() for gs in grads.values() for g in gs if g is not None))
        def ours() -> None:
            core.average(grads)

        def bare() -> None:
            dist.all_reduce(raw)

        ours_s: list[float] = []
        raw_s: list[float] = []
        for r in range(ROUNDS):  # short rounds, alternated, each side first in every other pair
            for name, call in ((("ours", ours), ("raw", bare)) if r % 2 == 0 else (("raw", bare), ("ours", ours))):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(CALLS):
                    call()
                (ours_s if name == "ours" else raw_s).append((time.perf_counter() - t0) / CALLS)
        out.update(ours_allreduce_ms=1000 * statistics.median(ours_s), raw_allreduce_ms=1000 * statistics.median(raw_s),
                   allreduce_ratio=statistics.median(o / w for o, w in zip(ours_s, raw_s, strict=True)),
                   allreduce_bytes=raw.numel() * 4)
        dist.destroy_process_group()
    if args.rank == 0:
        print(json.dumps(out), flush=True)


def run(world: int, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    port = free_tcp_port()
    cmd = [sys.executable, "-m", "bench.learning.learners", "--rank-of", str(world), "--port", str(port),
           "--algo", args.algo,
           "--batch", str(args.batch), "--hidden", str(args.hidden), "--updates", str(args.updates),
           "--threads", str(threads)]
    procs = [subprocess.Popen([*cmd, "--rank", str(r)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": str(threads)}) for r in range(world)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed: {[p.returncode for p in procs]}")
    return dict(json.loads(outs[0].strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algo", choices=["dqn", "sac"], default="dqn")
    ap.add_argument("--batch", type=int, default=512, help="global batch (items per update over all ranks)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank-of", dest="world", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args)
        return
    cores = os.cpu_count() or 1
    one = run(1, args.threads, args)
    two = run(2, args.threads, args)
    wide = run(1, 2 * args.threads, args)
    four = run(4, args.threads, args) if cores >= 4 * args.threads else None
    throughput = {"1": round(one["updates_per_s"] * args.batch, 1), "2": round(two["updates_per_s"] * args.batch, 1)}
    if four is not None:
        throughput["4"] = round(four["updates_per_s"] * args.batch, 1)
    result = {
        "algo": args.algo, "global_batch": args.batch, "hidden": [args.hidden, args.hidden],
        "torch_threads_per_rank": args.threads, "cores": cores, "backend": "gloo",
        "throughput": throughput,
        "throughput_1_rank_2x_threads": round(wide["updates_per_s"] * args.batch, 1),
        "updates_per_s": {"1": round(one["updates_per_s"], 1), "2": round(two["updates_per_s"], 1)},
        "speedup_2": round(two["updates_per_s"] / one["updates_per_s"], 3),
        "allreduce_bytes": two["allreduce_bytes"],
        "ours_allreduce_ms": round(two["ours_allreduce_ms"], 4), "raw_allreduce_ms": round(two["raw_allreduce_ms"], 4),
        "allreduce_overhead_ratio": round(two["allreduce_ratio"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
