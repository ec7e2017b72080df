"""HogWild DQN (algorithm.hogwild: true): gradient workers on the DQN loss, real services."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from harness.fleet_helpers import CONFIGS, only_run_dir, read_csv, rlfleet
from rlfleet.common import algorithms
from rlfleet.common.algorithms.dqn.worker import LocalBuffer
from rlfleet.common.config import load


def test_the_local_buffer_keeps_the_newest_transitions() -> None:
    buf = LocalBuffer(5)
    for start in (0, 3, 6):
        n = 3
        buf.add({"obs": np.arange(start, start + n, dtype=np.float32)[:, None], "action": np.zeros(n, np.int64),
                 "reward": np.zeros(n, np.float32), "next_obs": np.zeros((n, 1), np.float32),
                 "discount": np.ones(n, np.float32)})
    assert buf.size == 5
    assert sorted(buf.columns["obs"][:, 0].tolist()) == [4.0, 5.0, 6.0, 7.0, 8.0]  # 0..3 overwritten
    sample = buf.sample(64, np.random.default_rng(0))
    assert set(sample["obs"][:, 0].tolist()) <= {4.0, 5.0, 6.0, 7.0, 8.0}


def test_a_worker_pushes_nothing_until_its_buffer_holds_hogwild_start() -> None:
    cfg = algorithms.get("dqn").config(hidden=[8], batch_size=4, hogwild=True, hogwild_start=10)
    worker = algorithms.get("dqn").make_worker(cfg, gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2))
    items = {"obs": np.zeros((4, 2), np.float32), "action": np.zeros(4, np.int64), "reward": np.ones(4, np.float32),
             "next_obs": np.zeros((4, 2), np.float32), "discount": np.full(4, 0.9, np.float32),
             "version": np.zeros(4, np.int64)}
    assert worker.gradients(items)[0] is None and worker.gradients(items)[0] is None  # 8 held
    grads, figures = worker.gradients(items)  # 12 held
    assert grads is not None and grads.keys() == worker.weights().keys() and figures["loss"] > 0


def test_hogwild_runs_no_replay_and_no_learner() -> None:
    cfg = load(str(CONFIGS / "cartpole-dqn-hogwild.yaml"))
    assert cfg.algorithm.trains_with_workers()
    assert not load(str(CONFIGS / "cartpole-dqn.yaml")).algorithm.trains_with_workers()


@pytest.mark.e2e
def test_hogwild_dqn_solves_cartpole(tmp_path: Path) -> None:
    """Measured: 37.7k env steps, 23 s (2 workers)."""
    proc = rlfleet("up", "--config", str(CONFIGS / "cartpole-dqn-hogwild.yaml"), "--actors", "2",
                   "--until-return", "475", "--max-env-steps", "300000", "--max-seconds", "400",
                   "--runs", str(tmp_path))
    assert proc.returncode == 0 and "target reached" in proc.stdout, proc.stdout[-3000:]
    run_dir = only_run_dir(tmp_path)
    logs = {p.name for p in (run_dir / "logs").iterdir()}
    assert logs == {"actor-0.log", "actor-1.log", "evaluator.log", "paramserver-0.log"}
    assert int(read_csv(run_dir / "progress.csv")[-1]["updates"]) > 100
