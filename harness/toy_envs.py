"""Custom envs reachable as ``harness.toy_envs:Class`` (the module:Class form)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):  # type: ignore[type-arg]
    """Walk right to the end of a corridor: reward 1 at the end, 10 steps at most."""

    def __init__(self, length: int = 5) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0
        self.steps = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.pos / self.length, self.steps / 10], np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.pos, self.steps = 0, 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        self.steps += 1
        done = self.pos >= self.length
        return self._obs(), float(done), done, self.steps >= 10 and not done, {}


class Reach(gym.Env):  # type: ignore[type-arg]
    """A 1-D continuous task: move a point to a target within 20 steps; reward -|distance| per step.

    obs = (position, target); action in [-1, 1] moves by 0.25 * action. A random policy scores
    about -12; heading straight for the target scores between about -2 and 0.
    """

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.pos, self.target, self.steps = 0.0, 0.0, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.pos, self.target], np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.pos, self.target, self.steps = 0.0, float(self.np_random.uniform(-1, 1)), 0
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        move = float(np.clip(np.asarray(action).reshape(-1)[0], -1.0, 1.0))
        self.pos = float(np.clip(self.pos + 0.25 * move, -2.0, 2.0))
        self.steps += 1
        return self._obs(), -abs(self.pos - self.target), False, self.steps >= 20, {}


class UnboundedReach(Reach):
    """Reach with an action space PPO refuses: Box(-inf, inf), nothing to clip its actions to."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)


class LopsidedReach(Reach):
    """Reach with asymmetric action bounds, Box(-2, 0.5): left fast, right slowly. An action outside
    the bounds is an error here (the env checks what it is given, as a real robot's driver would)."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = gym.spaces.Box(np.array([-2.0], np.float32), np.array([0.5], np.float32))

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = np.asarray(action, np.float32).reshape(1)
        if not self.action_space.contains(a):
            raise ValueError(f"action {a} outside {self.action_space}")
        self.pos = float(np.clip(self.pos + 0.25 * float(a[0]), -2.0, 2.0))
        self.steps += 1
        return self._obs(), -abs(self.pos - self.target), False, self.steps >= 20, {}


class NaNCorridor(Corridor):
    """Corridor whose sensor fails now and then: every ``nan_every``-th step's observation is NaN, and every
    ``inf_reward_every``-th step's reward is Inf (steps counted over the env's life, resets included)."""

    def __init__(self, length: int = 5, nan_every: int = 37, inf_reward_every: int = 53) -> None:
        super().__init__(length)
        self.nan_every, self.inf_reward_every = nan_every, inf_reward_every
        self.total = 0

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        self.total += 1
        if self.total % self.nan_every == 0:
            obs = np.full_like(obs, np.nan)
        if self.total % self.inf_reward_every == 0:
            reward = float("inf")
        return obs, reward, terminated, truncated, info
