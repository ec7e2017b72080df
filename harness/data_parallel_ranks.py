"""What the data-parallel tests run: one rank of a real gloo process group (a process of its own),
or the one-process reference, training an algorithm's learner on a share of fixed batches.

    python harness/data_parallel_ranks.py ALGO RANK WORLD PORT DATA.npz OUT.npz [ahead]

Each step's global batch is split in WORLD equal slices (items for DQN and SAC, segments for
PPO); rank r learns from slice r with the per-rank config (the global batch sizes / WORLD),
its gradients averaged over the group. OUT.npz: the learner's published weights at the end.
With ``ahead``, rank 1 first learns alone from the first two batches (as a rank that resumed from
a newer checkpoint), then the group forms and every rank takes its state (broadcast_learner).
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

STEPS = 5
ITEMS = 64  # DQN / SAC transitions per global batch
SEGMENTS, SEGMENT_LENGTH = 8, 16  # PPO: segments per global batch, their length


def learner(algo: str, world: int, averager: Any = None) -> Any:
    from rlfleet.common import algorithms

    if algo == "ppo":
        from rlfleet.common.algorithms.ppo.config import PPOConfig

        env = gym.make("CartPole-v1")
        per_rank = SEGMENTS // world
        # two epochs of one minibatch: the order of rows in an epoch does not matter, only what is in it
        cfg: Any = PPOConfig(segment_length=SEGMENT_LENGTH, batch_segments=per_rank,
                             minibatch_size=per_rank * SEGMENT_LENGTH, epochs=2, obs_norm=True)
    elif algo == "sac":
        from rlfleet.common.algorithms.sac.config import SACConfig

        env = gym.make("Pendulum-v1")
        cfg = SACConfig(batch_size=ITEMS // world, hidden=[32, 32])
    else:
        from rlfleet.common.algorithms.dqn.config import DQNConfig

        env = gym.make("CartPole-v1")
        cfg = DQNConfig(batch_size=ITEMS // world)
    return algorithms.get(algo).make_learner(cfg, env.observation_space, env.action_space, device="cpu", seed=0,
                                             averager=averager)


def batches(algo: str, data: dict[str, np.ndarray], rank: int, world: int) -> list[dict[str, np.ndarray]]:
    out = []
    for step in range(STEPS):
        full = {key.split("/", 1)[1]: value for key, value in data.items() if key.startswith(f"{step}/")}
        n = len(full["version"])
        share = slice(rank * n // world, (rank + 1) * n // world)
        out.append({key: value[share] for key, value in full.items()})
    return out


def main(argv: list[str]) -> int:
    algo, rank, world, port, data_path, out_path = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), argv[4], argv[5]
    ahead = argv[6:] == ["ahead"]
    torch.set_num_threads(1)
    core = learner(algo, world)
    with np.load(data_path) as npz:
        data = dict(npz)
    steps = batches(algo, data, rank, world)
    if ahead and rank == 1:
        for batch in steps[:2]:
            core.learn(batch)
    if world > 1:
        import torch.distributed as dist

        from rlfleet.common.algorithms.data_parallel import GradientAverager, broadcast_learner

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        averager = GradientAverager()
        resumed = core.state()  # a rank that trained ahead: as one that resumed from a newer checkpoint
        core = learner(algo, world, averager)
        core.load_state(resumed)
        src = broadcast_learner(core, averager)
        assert src == (1 if ahead else 0), src
        assert core.num_updates == (2 if ahead else 0) * (1 if algo != "ppo" else 2), core.num_updates
    for batch in steps[2 if ahead else 0:]:
        core.learn(batch)
    np.savez(Path(out_path), **core.weights())
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
