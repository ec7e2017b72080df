"""Continuous actions as actor-critics see them: networks act in [-1, 1], envs in their own bounds
(SAC, TD3), and the acting they share (:class:`BoundedActorPolicy`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlfleet.common.algorithms.acting import PolicyBase
from rlfleet.common.algorithms.contract import Columns
from rlfleet.common.algorithms.mlp import numpy_layers, numpy_mlp
from rlfleet.common.algorithms.noise import ExplorationNoise
from rlfleet.common.algorithms.weights import check_arrays

NO_EXTRAS: Columns = {}


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


class BoundedActorPolicy(PolicyBase):
    """A published actor (``actor.{0,2,..}.weight``/``.bias``) acting in numpy in [-1, 1], scaled to the
    env's bounds; uniform random actions until the fleet has taken ``learning_starts`` env steps. The
    algorithm says how the actor's output becomes an action (:meth:`unit_actions`, drawing its Gaussian
    noise from :attr:`noise`: white or coloured, ``noise_color``) and makes the actor's starting arrays
    (:meth:`actor_arrays`). No extras: the learner needs none."""

    def setup(self, observation_space: gym.Space, action_space: gym.Space, seed: int) -> None:
        assert isinstance(action_space, gym.spaces.Box)
        self.act_dim = dims(observation_space, action_space)[1]
        arrays = self.actor_arrays(observation_space, action_space, seed)
        self._shapes = {key: value.shape for key, value in arrays.items()}  # what load_weights accepts
        self._layers = numpy_layers(arrays, "actor")
        self.scale = ActionScale(action_space)
        self.warmup = self.cfg.learning_starts > 0  # uniform random actions until explore() says otherwise
        self.noise = ExplorationNoise(self.cfg.noise_color, self.cfg.noise_length, self.rng)

    def actor_arrays(self, observation_space: gym.Space, action_space: gym.Space, seed: int) -> dict[str, np.ndarray]:
        """The actor's arrays as initialised from ``seed`` (what the learner starts from)."""
        raise NotImplementedError

    def unit_actions(self, out: np.ndarray, deterministic: bool) -> np.ndarray:
        """Actions in [-1, 1] from the actor's outputs ``out`` (float64 rows)."""
        raise NotImplementedError

    def exploration(self) -> dict[str, float]:
        """Figures of the exploration after the warm-up, for explore() to report."""
        return {}

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """The actor's arrays, all checked before any is used."""
        check_arrays(self._shapes, weights)
        self._layers = numpy_layers(weights, "actor")

    def explore(self, actor_index: int, num_actors: int, fleet_env_steps: int) -> dict[str, float]:
        """Uniform random actions until the fleet has taken ``learning_starts`` env steps."""
        left = max(0, self.cfg.learning_starts - fleet_env_steps)
        self.warmup = left > 0
        return {"warmup_steps_left": float(left), **self.exploration()}

    def act(self, obs: np.ndarray, *, deterministic: bool = False) -> tuple[np.ndarray, Any]:
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        if self.warmup and not deterministic:
            return self.scale.to_env(self.rng.uniform(-1.0, 1.0, (len(x), self.act_dim))), NO_EXTRAS
        out = numpy_mlp(self._layers, x, "relu").astype(np.float64)
        return self.scale.to_env(self.unit_actions(out, deterministic)), NO_EXTRAS
