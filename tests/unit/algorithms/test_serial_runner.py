"""The serial runner (cli/serial.py): the shipped configs' algorithms alone, in one process, no sockets.

It is the reference the fleet is judged against, so it must solve what the fleet solves, be repeatable
seed for seed, and leave a run directory `rlfleet eval` reads."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.cli.evaluate import load_for_eval
from rlfleet.cli.serial import SerialError, SerialRunner, train_serial
from rlfleet.common import config
from rlfleet.common.config import Experiment

ROOT = Path(__file__).resolve().parents[3]


def load(name: str, *sets: str) -> Experiment:
    return config.load(ROOT / "configs" / name, list(sets), environ={})


@pytest.mark.parametrize(("name", "target", "budget"), [
    ("cartpole-dqn.yaml", 475.0, 60_000),
    ("cartpole-ppo.yaml", 475.0, 100_000),
    ("pendulum-sac.yaml", -200.0, 20_000),
    ("cartpole-a3c.yaml", 475.0, 100_000),  # gradient workers: lanes and the paramserver's optimizer
])
def test_solves_the_shipped_config(name: str, target: float, budget: int, tmp_path: Path) -> None:
    cfg = load(name)
    result = train_serial(cfg, until_return=target, max_env_steps=budget, run_dir=tmp_path)
    assert result.solved, f"{name}: best {result.best} after {result.env_steps} env steps"
    assert result.evaluations[-1].mean >= target and result.env_steps_to_target == result.evaluations[-1].env_steps
    # the run directory: the evaluator's CSV columns and a checkpoint `rlfleet eval` scores
    with open(tmp_path / "evaluations.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["mean_return"]) for r in rows] == pytest.approx([e.mean for e in result.evaluations], abs=1e-3)
    loaded = load_for_eval(tmp_path / "learner" / "checkpoint.pt")
    assert loaded.exact and loaded.version == result.version and loaded.cfg.algorithm.name == cfg.algorithm.name


def test_dqn_values_propagate_past_the_n_step_horizon() -> None:
    """Balancing alone can be learnt from short-sighted values (CartPole forgives a lot); bootstrapping
    shows in Q: without it Q(s0) <= 1 + g + g^2 < 3."""
    runner = SerialRunner(load("cartpole-dqn.yaml"))
    try:
        assert runner.run(until_return=475.0, max_env_steps=60_000).solved
        policy = runner.lanes[0].policy
        starts = gym.make_vec("CartPole-v1", num_envs=8)
        start, _ = starts.reset(seed=0)
        starts.close()
        q_start = float(policy.q_values(start).max(axis=1).mean())  # type: ignore[attr-defined]
    finally:
        runner.close()
    assert q_start > 10, f"Q(s0) = {q_start}: values do not propagate past the n-step horizon"


def test_continuous_ppo_learns_reach() -> None:
    """A random policy scores about -12 on Reach, heading for the target -2..0."""
    cfg = load("cartpole-ppo.yaml", "env.id=harness.toy_envs:Reach", "algorithm.segment_length=64",
               "algorithm.minibatch_size=128", "algorithm.epochs=10", "algorithm.gamma=0.95",
               "algorithm.gae_lambda=0.9", "algorithm.log_std_init=-0.5", "algorithm.obs_norm=true",
               "algorithm.anneal_lr=false", "algorithm.anneal_clip=false", "actor.steps_per_round=64",
               "evaluator.every_steps=4096")
    result = train_serial(cfg, until_return=-1.5, max_env_steps=100_000)
    assert result.solved, f"best {result.best} after {result.env_steps} env steps"


@pytest.mark.parametrize("name", ["cartpole-dqn.yaml", "cartpole-ppo.yaml"])
def test_same_seed_same_run(name: str) -> None:
    """Same config and seed: the same evaluations and the same weights (one process, one thread)."""
    runs = []
    for _ in range(2):
        runner = SerialRunner(load(name, "evaluator.every_steps=1000"))
        try:
            result = runner.run(max_env_steps=3000)
            runs.append(([e.mean for e in result.evaluations], runner.learner.weights(), result.updates))
        finally:
            runner.close()
    (evals_a, weights_a, updates_a), (evals_b, weights_b, updates_b) = runs
    assert updates_a == updates_b > 0
    assert evals_a == evals_b
    assert weights_a.keys() == weights_b.keys()
    for key in weights_a:
        np.testing.assert_array_equal(weights_a[key], weights_b[key])
    other = SerialRunner(load(name, "seed=1", "evaluator.every_steps=1000"))
    try:
        other.run(max_env_steps=3000)
        assert any(not np.array_equal(v, weights_a[k]) for k, v in other.learner.weights().items())
    finally:
        other.close()


def test_barrier_round_trains_once_per_round() -> None:
    """Barrier: a version per round of actor.steps_per_round vector steps, updates_per_round updates each
    once replay holds its min size."""
    cfg = load("cartpole-dqn-barrier.yaml")
    runner = SerialRunner(cfg)
    try:
        result = runner.run(max_env_steps=8 * cfg.actor.count * cfg.env.num_envs * cfg.actor.steps_per_round)
    finally:
        runner.close()
    assert result.version == 8
    per_round = cfg.actor.count * cfg.env.num_envs * cfg.actor.steps_per_round
    table = next(t for t in cfg.replay.tables if t.name == cfg.learner.table)
    rounds_learnt = sum(1 for k in range(1, 9) if k * per_round - cfg.actor.count * cfg.env.num_envs >= table.min_size)
    assert result.updates == rounds_learnt * cfg.learner.updates_per_round


def test_gradient_workers_step_as_the_paramserver() -> None:
    """Async: one optimizer step per completed rollout of each worker; barrier (A2C): one step per round,
    the mean of the workers' gradients. Every lane acts with the newest weights after a step."""
    for name, per_rollout in (("cartpole-a3c.yaml", 2), ("cartpole-a2c.yaml", 1)):
        cfg = load(name, "evaluator.every_steps=100000")
        assert cfg.actor.count == 2
        runner = SerialRunner(cfg)
        try:
            pool = runner.pool
            assert pool is not None
            rollouts = 10
            result = runner.run(max_env_steps=rollouts * cfg.algorithm.n_steps * cfg.actor.count * cfg.env.num_envs)
            assert result.updates == result.version == rollouts * per_rollout, name
            newest = runner.weights()
            for lane in pool.lanes:
                for key, value in lane.worker.weights().items():
                    np.testing.assert_array_equal(value, newest[key])
            assert pool.trainer.optimizer is not None and pool.trainer.optimizer.steps == result.updates
        finally:
            runner.close()


def test_refuses_what_it_cannot_run() -> None:
    with pytest.raises(SerialError) as info:
        SerialRunner(load("cartpole-dynaq.yaml"))
    assert all(w in str(info.value) for w in ["planning.enabled", "allowed"]), str(info.value)


def test_cli_trains_and_refuses(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "rlfleet.cli",
                         "train", "--serial", "--config", "configs/cartpole-ppo.yaml",
                         "--until-return", "475", "--max-env-steps", "100000", "--runs", str(tmp_path)],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "solved after" in ok.stdout
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "learner" / "checkpoint.pt").is_file() and (run_dir / "result.json").is_file()
    bad = subprocess.run([sys.executable, "-m", "rlfleet.cli",
                          "train", "--serial", "--config", "configs/cartpole-dynaq.yaml",
                          "--until-return", "475", "--runs", str(tmp_path / "refused")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "planning.enabled" in bad.stderr
    assert not (tmp_path / "refused").exists()
