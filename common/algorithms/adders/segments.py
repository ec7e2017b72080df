"""Fixed-length trajectory segments from a gymnasium vector env, one per env slot every T steps.

A segment of one slot holds T consecutive env steps (they may span episodes):

    obs[T, ...]        the observation acted on
    action[T, ...]     the action as sampled (continuous: the raw Gaussian sample, unclipped,
                       from extras["raw_action"], so its log-prob is the one in logp)
    reward[T]
    terminated[T]      the episode ended for good after this step: no bootstrap
    truncated[T]       the episode was cut (time limit) after this step: bootstrap from final_obs
    final_obs[T, ...]  the observation after a truncated step (zeros elsewhere)
    logp[T], value[T]  the policy's extras: the behaviour log-prob and value
    bootstrap_obs[...] the observation after the last step (the value to bootstrap from)
    version            int64: the oldest weights version among the T steps

Truncation carries the final observation, not a value computed by the actor:
the learner recomputes every value with its current critic before GAE (APPO,
see the learner), so the bootstrap at a time limit must use that critic too.
It costs one observation per step, which for flat observations is small.

``version`` is the minimum over the segment (versions only grow): staleness is
judged by the oldest step, and the per-step behaviour log-prob already carries
what the off-policy correction needs.

gymnasium 1.x vector envs autoreset. In ``NEXT_STEP`` mode the step after an
episode's end resets that slot, ignores its action and returns the reset
observation: it is no env step of the segment and is dropped (as in
:mod:`rlfleet.common.algorithms.adders.nstep`). In ``SAME_STEP`` mode the final
observation is in ``infos["final_obs"]``.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from rlfleet.common.algorithms.adders.vector_steps import Columns, VectorStep, VectorStepAdder, stored_obs_dtype


class SegmentAdder(VectorStepAdder):
    """Turns vector-env steps into T-step segments (see the module docstring for the columns)."""

    def __init__(
        self,
        num_envs: int,
        segment_length: int,
        observation_space: gym.Space,
        action_space: gym.Space,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        extras: Mapping[str, tuple[str, tuple[int, ...]]] | None = None,
    ) -> None:
        """``extras``: the policy's per-step extras kept as columns (dtype name, per-step shape);
        others are ignored."""
        if segment_length < 1:
            raise ValueError(f"segment_length={segment_length}; allowed: >= 1")
        assert observation_space.shape is not None
        super().__init__(num_envs, tuple(observation_space.shape), autoreset_mode, stored_obs_dtype(observation_space))
        self.T = segment_length
        discrete = isinstance(action_space, gym.spaces.Discrete)
        act_shape = () if discrete else tuple(action_space.shape or ())
        n, T = num_envs, segment_length
        self._cols: Columns = {
            "obs": np.zeros((n, T, *self.obs_shape), self.obs_dtype),
            "action": np.zeros((n, T, *act_shape), np.int64 if discrete else np.float32),
            "reward": np.zeros((n, T), np.float32),
            "terminated": np.zeros((n, T), bool),
            "truncated": np.zeros((n, T), bool),
            "final_obs": np.zeros((n, T, *self.obs_shape), self.obs_dtype),
        }
        for key, (dtype, shape) in (extras or {}).items():
            self._cols[key] = np.zeros((n, T, *shape), dtype)
        self._version = np.zeros((n, T), np.int64)

    def schema(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Every column of the segments :meth:`add` returns: (dtype name, per-segment shape)."""
        out = {key: (col.dtype.name, tuple(col.shape[1:])) for key, col in self._cols.items()}
        out["bootstrap_obs"] = (self.obs_dtype.name, self.obs_shape)
        out["version"] = ("int64", ())
        return out

    def _record(self, step: VectorStep) -> Columns:
        """The segments ``step`` completes (zero or more rows)."""
        final, terminated, truncated = step.final_obs, step.terminated, step.truncated
        slots = np.flatnonzero(step.valid)
        t = self._length[slots]
        cols = self._cols
        cols["obs"][slots, t] = self._current[slots]
        raw = step.extras.get("raw_action", step.actions)
        cols["action"][slots, t] = np.asarray(raw)[slots]
        cols["reward"][slots, t] = np.asarray(step.rewards, np.float32)[slots]
        cols["terminated"][slots, t] = terminated[slots]
        cols["truncated"][slots, t] = truncated[slots] & ~terminated[slots]
        cols["final_obs"][slots, t] = np.where((truncated & ~terminated)[slots].reshape(-1, *[1] * len(
            self.obs_shape)), final[slots], 0)
        for key, value in step.extras.items():
            if key in cols:
                cols[key][slots, t] = np.asarray(value)[slots]
        self._version[slots, t] = step.version
        self._length[slots] += 1

        full = np.flatnonzero(self._length == self.T)
        items: Columns = {key: value[full] for key, value in cols.items()}
        items["bootstrap_obs"] = final[full].astype(self.obs_dtype, copy=True)
        items["version"] = self._version[full].min(axis=1) if len(full) else np.zeros(0, np.int64)
        self._length[full] = 0
        return items
