"""What the DQN tests share: CartPole's spaces and random batches of transitions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

CARTPOLE = gym.make("CartPole-v1")
OBS_SPACE, ACT_SPACE = CARTPOLE.observation_space, CARTPOLE.action_space


def random_batch(rng: np.random.Generator, size: int = 32) -> dict[str, np.ndarray]:
    return {
        "obs": rng.normal(size=(size, 4)).astype(np.float32),
        "action": rng.integers(2, size=size),
        "reward": rng.normal(size=size).astype(np.float32),
        "next_obs": rng.normal(size=(size, 4)).astype(np.float32),
        "discount": (rng.random(size) < 0.9).astype(np.float32) * 0.97,
        "version": np.zeros(size, np.int64),
    }
