"""What every adder of gymnasium vector-env steps keeps: the observation each slot acts on, the
autoreset mode, and which slots' next step is a reset.

gymnasium 1.x vector envs autoreset. In ``NEXT_STEP`` mode the step after an
episode's end resets that slot, ignores its action and returns the reset
observation with reward 0 and both flags False: it is no env step and adders
drop it. In ``SAME_STEP`` mode the ending step already returns the reset
observation and the final one is in ``infos["final_obs"]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

Columns = dict[str, np.ndarray]


def stored_obs_dtype(observation_space: Any) -> np.dtype[Any]:
    """How adders keep observations: uint8 images as uint8 (scaled on the learner's device), the rest float32."""
    dtype = getattr(observation_space, "dtype", None)
    return np.dtype(np.uint8) if dtype == np.uint8 else np.dtype(np.float32)


@dataclass
class VectorStep:
    """One checked vector step, as an adder records it."""

    actions: np.ndarray
    extras: Mapping[str, np.ndarray]
    rewards: np.ndarray
    terminated: np.ndarray  # bool per slot
    truncated: np.ndarray  # bool per slot
    valid: np.ndarray  # slots whose step is an env step (NEXT_STEP: not a reset)
    done: np.ndarray  # valid slots whose episode ended
    final_obs: np.ndarray  # each slot's observation after the step: the final one where an episode ended
    version: int


class VectorStepAdder:
    """The base of :class:`~rlfleet.common.algorithms.adders.nstep.NStepAdder` and the PPO segment adder: it
    checks each step and keeps the observations acted on; a subclass records a step (``_record``)."""

    def __init__(self, num_envs: int, obs_shape: tuple[int, ...],
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                 obs_dtype: type | np.dtype[Any] = np.float32) -> None:
        """``obs_dtype``: observations as stored and sent (:func:`stored_obs_dtype`: uint8 frames stay uint8)."""
        mode = autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
        if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            raise ValueError(f"autoreset mode {mode.value!r} is not supported; allowed: NextStep, SameStep")
        self.num_envs = num_envs
        self.obs_shape = tuple(obs_shape)
        self.obs_dtype = np.dtype(obs_dtype)
        self.autoreset_mode = mode
        self._length = np.zeros(num_envs, np.int64)  # steps recorded, not yet emitted, per slot
        self._current = np.zeros((num_envs, *self.obs_shape), self.obs_dtype)
        self._skip = np.zeros(num_envs, bool)  # NEXT_STEP: this slot's next step is a reset
        self._started = False

    @property
    def pending(self) -> int:
        """Steps recorded but not yet emitted (all slots)."""
        return int(self._length.sum())

    def reset(self, obs: np.ndarray) -> None:
        """Start over from the observations of ``envs.reset()``; what was not emitted is dropped."""
        self._current[:] = self._check_obs(obs)
        self._length[:] = 0
        self._skip[:] = False
        self._started = True

    def add(
        self,
        actions: np.ndarray,
        extras: Mapping[str, np.ndarray],
        next_obs: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        infos: Mapping[str, Any] | None,
        version: int,
    ) -> Columns:
        """Record one vector step; return the items it completes (zero or more rows)."""
        if not self._started:
            raise RuntimeError(f"{type(self).__name__}.add() before reset(): pass the observations of envs.reset()")
        next_obs = self._check_obs(next_obs)
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool)
        valid = ~self._skip
        done = valid & (terminated | truncated)
        items = self._record(VectorStep(actions, extras, rewards, terminated, truncated, valid, done,
                                        self._final_obs(next_obs, done, infos), version))
        # the step's observations are the next ones acted on; NEXT_STEP: ended slots reset next
        self._current[:] = next_obs
        if self.autoreset_mode is AutoresetMode.NEXT_STEP:
            self._skip = done
        return items

    def _record(self, step: VectorStep) -> Columns:
        """Record ``step`` (the observations acted on are ``self._current``); the items it completes."""
        raise NotImplementedError

    def _check_obs(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs)
        if obs.shape != (self.num_envs, *self.obs_shape):
            raise ValueError(f"observations of shape {obs.shape}; expected {(self.num_envs, *self.obs_shape)}")
        return obs

    def _final_obs(self, next_obs: np.ndarray, done: np.ndarray, infos: Mapping[str, Any] | None) -> np.ndarray:
        """Each slot's observation after this step: the final one where an episode ended."""
        if self.autoreset_mode is AutoresetMode.NEXT_STEP or not done.any():
            return next_obs
        if infos is None or "final_obs" not in infos:
            raise ValueError("SAME_STEP autoreset: an episode ended but infos has no 'final_obs'")
        final = next_obs.astype(self.obs_dtype, copy=True)
        for slot in np.flatnonzero(done):
            final[slot] = infos["final_obs"][slot]
        return final
