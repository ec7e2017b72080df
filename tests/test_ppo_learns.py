"""PPO learns in one process (no services): CartPole-v1 (discrete) and a 1-D reaching task
(continuous), with the plain loop vector env -> policy.act -> adder -> learner.learn -> load_weights."""

from __future__ import annotations

import gymnasium as gym
import pytest

from common.algorithms.ppo.config import PPOConfig
from tests.ppo_helpers import train
from tests.toy_envs import Reach

# rl-baselines3-zoo's CartPole-v1 PPO: 8 envs, n_steps 32, batch 256, 20 epochs, lambda 0.8, gamma 0.98,
# lr and clip annealed linearly over 1e5 steps. Solves in ~20-30k env steps, a few seconds.
CARTPOLE = dict(segment_length=32, batch_segments=8, minibatch_size=256, epochs=20, gamma=0.98, gae_lambda=0.8,
                ent_coef=0.0, lr=1e-3, anneal_lr=True, anneal_clip=True, anneal_env_steps=100_000)


@pytest.mark.parametrize("seed", [0, 1])
def test_learns_cartpole(seed: int) -> None:
    best, steps = train(PPOConfig(**CARTPOLE), lambda: gym.make("CartPole-v1"), 8, 100_000, 475, seed=seed)
    assert best >= 475, f"deterministic mean return {best} after {steps} env steps"


def test_learns_continuous_reach() -> None:
    """A random policy scores about -12, heading for the target -2..0."""
    cfg = PPOConfig(segment_length=64, batch_segments=8, minibatch_size=128, epochs=10, gamma=0.95, gae_lambda=0.9,
                    ent_coef=0.0, lr=1e-3, log_std_init=-0.5, obs_norm=True)
    best, steps = train(cfg, Reach, 8, 100_000, -1.5, seed=0)
    assert best >= -1.5, f"deterministic mean return {best} after {steps} env steps"
