"""n-step transitions from a gymnasium vector env, one window per env slot.

An n-step transition starting at time t of one episode is

    obs       = s_t
    action    = a_t
    reward    = r_t + g r_{t+1} + ... + g^(k-1) r_{t+k-1}
    next_obs  = s_{t+k}
    discount  = 0 if the episode terminated within those k steps, else g^k

with k = n, or fewer when the episode ends first: every window still open at
an episode's end is flushed with its shorter k. Truncation (a time limit) is
not termination: the flushed windows bootstrap from the final observation.

gymnasium 1.x vector envs autoreset. In ``NEXT_STEP`` mode (the default) the
step that ends an episode returns its final observation; the following
``step()`` resets that slot, ignores its action and returns the reset
observation with reward 0 and both flags False. That step is not a transition
and is dropped here. In ``SAME_STEP`` mode the ending step already returns the
reset observation and the final one is in ``infos["final_obs"]``.

Every transition carries ``version``: the weights version its first action was
acted with (the oldest in its window, as versions only grow), so the learner
can measure and bound staleness. DQN needs no extras from acting; any given are
ignored.
"""

from __future__ import annotations

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from rlfleet.common.algorithms.adders.vector_steps import Columns, VectorStep, VectorStepAdder


class NStepAdder(VectorStepAdder):
    """Turns vector-env steps into n-step transition columns.

    Usage::

        obs, _ = envs.reset(seed=seed)
        adder.reset(obs)
        while ...:
            actions, extras = policy.act(obs)
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            items = adder.add(actions, extras, obs, rewards, terminated, truncated, infos, version)
    """

    def __init__(
        self,
        num_envs: int,
        n_step: int,
        gamma: float,
        obs_shape: tuple[int, ...],
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        action_shape: tuple[int, ...] = (),
        action_dtype: type | np.dtype = np.int64,
        obs_dtype: type | np.dtype = np.float32,
    ) -> None:
        """``action_shape`` / ``action_dtype``: one action as stored (``()`` int64 for Discrete;
        ``(A,)`` float32 for a Box of A dimensions)."""
        if n_step < 1:
            raise ValueError(f"n_step={n_step}; allowed: >= 1")
        super().__init__(num_envs, obs_shape, autoreset_mode, obs_dtype)
        self.n_step = n_step
        self.gamma = gamma
        self._powers = gamma ** np.arange(n_step + 1, dtype=np.float64)
        # _upper[k, j] = gamma^(j - k) for j >= k: n-step returns of every window as one product.
        offsets = np.arange(n_step)[None, :] - np.arange(n_step)[:, None]
        self._upper = np.where(offsets >= 0, gamma ** np.maximum(offsets, 0), 0.0)
        # Per slot: a ring of the last n (obs, action, reward); `_length` entries
        # are open windows, the oldest at (_head - _length) % n.
        self._obs = np.zeros((num_envs, n_step, *self.obs_shape), self.obs_dtype)
        self.action_shape, self.action_dtype = tuple(action_shape), np.dtype(action_dtype)
        self._action = np.zeros((num_envs, n_step, *self.action_shape), self.action_dtype)
        self._reward = np.zeros((num_envs, n_step), np.float64)
        self._version = np.zeros((num_envs, n_step), np.int64)
        self._head = np.zeros(num_envs, np.int64)

    @classmethod
    def for_env(cls, envs: VectorEnv, n_step: int, gamma: float) -> NStepAdder:
        shape = envs.single_observation_space.shape
        if shape is None:
            raise ValueError(f"observation space {envs.single_observation_space} has no shape")
        mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        return cls(envs.num_envs, n_step, gamma, tuple(shape), mode)

    def reset(self, obs: np.ndarray) -> None:
        """Start over from the observations of ``envs.reset()``; open windows are dropped."""
        super().reset(obs)
        self._head[:] = 0

    def _record(self, step: VectorStep) -> Columns:
        """The transitions ``step`` completes (maybe none)."""
        slots = np.flatnonzero(step.valid)
        head = self._head[slots]
        self._obs[slots, head] = self._current[slots]
        actions = np.asarray(step.actions, self.action_dtype)
        if actions.shape[1:] != self.action_shape:
            raise ValueError(f"actions of shape {actions.shape}; this adder stores actions of shape"
                             f" {self.action_shape} per env slot")
        self._action[slots, head] = actions[slots]
        self._reward[slots, head] = np.asarray(step.rewards, np.float64)[slots]
        self._version[slots, head] = step.version
        self._head[slots] = (head + 1) % self.n_step
        self._length[slots] += 1

        return self._emit(np.flatnonzero(step.done | (step.valid & (self._length == self.n_step))), step.done,
                          step.terminated, step.final_obs)

    def schema(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Every column of the items :meth:`add` returns: (dtype name, per-item shape)."""
        obs = (self.obs_dtype.name, self.obs_shape)
        return {"obs": obs, "action": (self.action_dtype.name, self.action_shape), "reward": ("float32", ()),
                "next_obs": obs, "discount": ("float32", ()), "version": ("int64", ())}

    # -- internals ----------------------------------------------------------

    def _emit(self, slots: np.ndarray, done: np.ndarray, terminated: np.ndarray, bootstrap: np.ndarray) -> Columns:
        """Emit the oldest window of full slots and every open window of ended ones.

        ``bootstrap`` holds each slot's observation after this step (the final
        one where an episode ended). All slots at once: no Python loop per slot.
        """
        n = self.n_step
        length = self._length[slots]
        # Ring positions [slot, k] of each open window, oldest first.
        pos = ((self._head[slots] - length)[:, None] + np.arange(n)) % n
        k = np.arange(n)
        is_open = k < length[:, None]
        rewards = np.where(is_open, self._reward[slots[:, None], pos], 0.0)
        # Window k spans steps k..length-1: return[s, k] = sum_j>=k g^(j-k) r[s, j].
        returns = rewards @ self._upper.T
        ended = done[slots]
        emit = np.where(ended[:, None], is_open, k == 0)
        row, col = np.nonzero(emit)
        slot = slots[row]
        span = length[row] - col
        self._length[slots] = np.where(ended, 0, length - 1)
        return {
            "obs": self._obs[slot, pos[row, col]],
            "action": self._action[slot, pos[row, col]],
            "reward": returns[row, col].astype(np.float32),
            "next_obs": np.asarray(bootstrap[slot], self.obs_dtype),
            "discount": np.where(terminated[slot], 0.0, self._powers[span]).astype(np.float32),
            "version": self._version[slot, pos[row, col]],
        }
