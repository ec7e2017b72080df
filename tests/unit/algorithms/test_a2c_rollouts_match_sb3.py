"""Rollouts of the real env, collected by our worker lane and by SB3's A2C, give the same gradients.

test_a2c_matches_sb3.py pins the update on a made-up rollout; this pins the data path: LunarLander-v3 in
8 env slots seeded alike, SB3's ``collect_rollouts`` (its policy samples the actions, its VecEnv resets
ended episodes and folds gamma * V(final obs) into a truncated step's reward) and our lane of the
serial runner (vector env in SameStep autoreset, the segment adder, the worker's n-step returns) fed the
actions SB3 took, from the same weights. Every rollout the two must see the same observations, and the
gradient of SB3's loss (``A2C.train()`` at lr 0 leaves it in ``.grad``, clipped) must equal the one our
worker pushes, over enough steps that episodes end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3 import A2C  # a dev dependency (pyproject.toml), as the benches' peers
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from harness.sb3_match import A3C_MODULES, copy_into_sb3
from rlfleet.cli.serial_workers import WorkerLane
from rlfleet.common import algorithms, config

ROOT = Path(__file__).resolve().parents[3]
ENVS, ROLLOUTS = 8, 40
MODULES = A3C_MODULES


class Replay:
    """Acts as SB3 did: the actions of the rollout, one vector step at a time."""

    def __init__(self) -> None:
        self.actions: np.ndarray = np.zeros((0, ENVS), np.int64)
        self.t = 0

    def act(self, obs: np.ndarray, *, deterministic: bool = False) -> tuple[np.ndarray, dict[str, Any]]:
        action = self.actions[self.t]
        self.t += 1
        return action, {}


def test_real_rollouts_give_sb3_a2c_gradients() -> None:
    # the zoo's A2C LunarLander settings on the shipped A3C config
    cfg = config.load(ROOT / "configs" / "cartpole-a3c.yaml",
                      ["actor.count=1", f"env.num_envs={ENVS}", "env.id=LunarLander-v3", "algorithm.gamma=0.995",
                       "algorithm.ent_coef=0.00001"], environ={})
    lane = WorkerLane(cfg, algorithms.get("a3c"), 0)
    seed = cfg.seed * 100_003  # worker 0's env seeds: seed + slot
    venv = DummyVecEnv([lambda: Monitor(gym.make(cfg.env.id)) for _ in range(ENVS)])
    venv.seed(seed)
    algo = cfg.algorithm
    model = A2C("MlpPolicy", venv, n_steps=algo.n_steps, gamma=algo.gamma, ent_coef=algo.ent_coef,
                vf_coef=algo.vf_coef, max_grad_norm=algo.max_grad_norm, learning_rate=0.0, device="cpu", seed=0)
    model.set_logger(configure(None, []))
    policy = model.policy
    copy_into_sb3(policy, lane.worker.weights(), MODULES)
    _, callback = model._setup_learn(ENVS * algo.n_steps * ROLLOUTS, None)
    np.testing.assert_array_equal(model._last_obs, lane.obs)
    replay = Replay()
    worker_act = lane.worker.act
    lane.worker.act = replay.act  # type: ignore[method-assign]
    ended = 0
    try:
        for rollout in range(ROLLOUTS):
            model.collect_rollouts(model.env, callback, model.rollout_buffer, algo.n_steps)
            buffer = model.rollout_buffer
            replay.actions, replay.t = buffer.actions[:, :, 0].astype(np.int64), 0
            ended += int(buffer.episode_starts[1:].sum())
            grads = None
            for _ in range(algo.n_steps):
                grads = lane.step(0)
            assert grads is not None, "the lane completed no rollout in n_steps vector steps"
            np.testing.assert_allclose(lane.obs, model._last_obs, atol=1e-6,
                                       err_msg=f"observations after rollout {rollout}")
            model.train()  # lr 0: weights unchanged, the clipped gradient left in .grad
            for module, name in MODULES.items():
                layer = policy.get_submodule(module)
                for part in ("weight", "bias"):
                    theirs = getattr(layer, part).grad.numpy()
                    np.testing.assert_allclose(grads[f"{name}.{part}"], theirs, rtol=1e-4, atol=1e-6,
                                               err_msg=f"{name}.{part} gradient, rollout {rollout}")
    finally:
        lane.worker.act = worker_act  # type: ignore[method-assign]
        lane.close()
        venv.close()
    assert ended >= 5, f"only {ended} episodes ended: the resets are not compared"
