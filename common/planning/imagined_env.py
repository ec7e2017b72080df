"""A vector env whose dynamics are the world model: what planners step instead of the real env.

It behaves like a gymnasium 1.x vector env to the algorithm's adder, so
imagined transitions are built by the same code, in the same columns, as real
ones: each slot starts from a real observation (``start_states``, drawn from
the real table), steps the model, ends when the model predicts a termination
(a terminal transition: discount 0) or after ``rollout_length`` steps (a
truncation: the adder bootstraps from the last predicted observation), then
autoresets in the algorithm's mode (``NextStep``: the following step returns a
new start state, reward 0, and is dropped by the adder; ``SameStep``: the
ending step returns it, the predicted one is in ``infos["final_obs"]``).
Predicted observations are clipped to the observation space's finite bounds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from rlfleet.common.planning.dynamics import DynamicsNet


class ImaginedEnv:
    def __init__(self, net: DynamicsNet, num_envs: int, rollout_length: int,
                 start_states: Callable[[int], np.ndarray], observation_space: gym.spaces.Box,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP) -> None:
        if rollout_length < 1:
            raise ValueError(f"rollout_length={rollout_length}; allowed: >= 1")
        self.net = net
        self.num_envs = num_envs
        self.rollout_length = rollout_length
        self.start_states = start_states
        mode = autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
        if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            raise ValueError(f"autoreset mode {mode.value!r}; allowed: NextStep, SameStep")
        self.autoreset_mode = mode
        self.metadata = {"autoreset_mode": mode}
        self.single_observation_space = observation_space
        self._low = observation_space.low.astype(np.float32)  # infinite bounds clip nothing
        self._high = observation_space.high.astype(np.float32)
        self._obs = np.zeros((num_envs, *observation_space.shape), np.float32)
        self._t = np.zeros(num_envs, np.int64)
        self._resets = np.zeros(num_envs, bool)  # NextStep: this slot's next step is a reset
        self.steps = 0  # model steps taken (slot steps, resets excluded)

    def _start(self, slots: np.ndarray) -> None:
        if len(slots):
            self._obs[slots] = self._check(self.start_states(len(slots)), len(slots))
            self._t[slots] = 0

    def _check(self, states: np.ndarray, n: int) -> np.ndarray:
        states = np.asarray(states, np.float32)
        if states.shape != (n, *self._obs.shape[1:]):
            raise ValueError(f"start states of shape {states.shape}; the model needs {(n, *self._obs.shape[1:])}")
        return states

    def reset(self) -> tuple[np.ndarray, dict[str, Any]]:
        self._start(np.arange(self.num_envs))
        self._resets[:] = False
        return self._obs.copy(), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        n = self.num_envs
        rewards = np.zeros(n, np.float32)
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        resetting = np.flatnonzero(self._resets)
        stepping = np.flatnonzero(~self._resets)
        infos: dict[str, Any] = {}
        if len(stepping):
            nxt, rew, term = self.net.predict(self._obs[stepping], np.asarray(actions)[stepping])
            self._obs[stepping] = np.clip(nxt, self._low, self._high)
            rewards[stepping] = rew
            self._t[stepping] += 1
            terminated[stepping] = term
            truncated[stepping] = ~term & (self._t[stepping] >= self.rollout_length)
            self.steps += len(stepping)
        done = terminated | truncated
        self._start(resetting)
        self._resets[:] = False
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            self._resets[done] = True
        elif done.any():
            infos["final_obs"] = np.array([o.copy() if d else None for o, d in zip(self._obs, done, strict=True)],
                                          dtype=object)
            infos["_final_obs"] = done.copy()
            self._start(np.flatnonzero(done))
        return self._obs.copy(), rewards, terminated, truncated, infos
