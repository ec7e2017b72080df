"""SAC acting, in numpy: tanh(mean + std * noise) of the published actor, scaled to the env's
bounds; uniform random actions while the fleet is within ``learning_starts`` env steps;
``deterministic=True`` (evaluators) is tanh(mean). No extras: the learner needs none.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np

from common.algorithms.acting import PolicyBase
from common.algorithms.actions import ActionScale, dims
from common.algorithms.contract import Columns
from common.algorithms.mlp import numpy_layers, numpy_mlp
from common.algorithms.sac.networks import seeded_networks
from common.algorithms.weights import check_arrays, publish_arrays

NO_EXTRAS: Columns = {}


class SACPolicy(PolicyBase):
    """``seed`` initialises the actor (the learner's seed); ``act_seed`` seeds the sampling rng."""

    def setup(self, observation_space: gym.Space, action_space: gym.Space, seed: int) -> None:
        cfg = self.cfg
        assert isinstance(action_space, gym.spaces.Box)
        self.act_dim = dims(observation_space, action_space)[1]
        arrays = publish_arrays(seeded_networks(cfg, observation_space, action_space, seed).actor, "actor.")
        self._shapes = {key: value.shape for key, value in arrays.items()}  # what load_weights accepts
        self._layers = numpy_layers(arrays, "actor")
        self.scale = ActionScale(action_space)
        self.warmup = cfg.learning_starts > 0  # uniform random actions until explore() says otherwise

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """The actor's arrays (``actor.{0,2,..}.weight``/``.bias``), all checked before any is used."""
        check_arrays(self._shapes, weights)
        self._layers = numpy_layers(weights, "actor")

    def explore(self, actor_index: int, num_actors: int, fleet_env_steps: int) -> dict[str, float]:
        """Uniform random actions until the fleet has taken ``learning_starts`` env steps."""
        left = max(0, self.cfg.learning_starts - fleet_env_steps)
        self.warmup = left > 0
        return {"warmup_steps_left": float(left)}

    def act(self, obs: np.ndarray, *, deterministic: bool = False) -> tuple[np.ndarray, Columns]:
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        if self.warmup and not deterministic:
            return self.scale.to_env(self.rng.uniform(-1.0, 1.0, (len(x), self.act_dim))), NO_EXTRAS
        out = numpy_mlp(self._layers, x, "relu").astype(np.float64)
        mean, log_std = out[:, :self.act_dim], out[:, self.act_dim:]
        if deterministic:
            return self.scale.to_env(np.tanh(mean)), NO_EXTRAS
        std = np.exp(np.clip(log_std, self.cfg.log_std_min, self.cfg.log_std_max))
        return self.scale.to_env(np.tanh(mean + std * self.rng.standard_normal(mean.shape))), NO_EXTRAS

