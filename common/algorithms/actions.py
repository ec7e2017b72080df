"""Continuous actions as actor-critics see them: networks act in [-1, 1], envs in their own bounds
(SAC, TD3)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch


def dims(observation_space: gym.Space, action_space: gym.Space) -> tuple[int, int]:
    assert observation_space.shape is not None and action_space.shape is not None
    return (int(np.prod(observation_space.shape, dtype=np.int64)), int(np.prod(action_space.shape, dtype=np.int64)))


class ActionScale:
    """[-1, 1] <-> [low, high] per action dimension (asymmetric bounds too)."""

    def __init__(self, action_space: gym.spaces.Box) -> None:
        self.low = action_space.low.reshape(-1).astype(np.float64)
        self.high = action_space.high.reshape(-1).astype(np.float64)
        self.shape = tuple(action_space.shape or ())
        self._bounds: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def to_env(self, unit: np.ndarray) -> np.ndarray:
        """Actions in [-1, 1] -> the env's bounds, float32, clipped (rounding never leaves the box)."""
        env = self.low + (np.asarray(unit, np.float64) + 1.0) * 0.5 * (self.high - self.low)
        return np.clip(env, self.low, self.high).astype(np.float32).reshape(len(unit), *self.shape)

    def to_unit(self, env: torch.Tensor) -> torch.Tensor:
        """Env actions (a batch, any device) -> [-1, 1]."""
        bounds = self._bounds.get((env.dtype, env.device))
        if bounds is None:  # made once per dtype and device, not every update
            bounds = self._bounds[(env.dtype, env.device)] = (
                torch.as_tensor(self.low, dtype=env.dtype, device=env.device),
                torch.as_tensor(self.high, dtype=env.dtype, device=env.device))
        low, high = bounds
        return (2.0 * (env.reshape(len(env), -1) - low) / (high - low) - 1.0).clamp(-1.0, 1.0)
