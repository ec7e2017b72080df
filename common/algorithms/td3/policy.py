"""TD3 acting, in numpy: tanh of the published actor, plus Gaussian exploration noise
(``exploration_noise``, in units of half the action range, from the policy's own rng), clipped
to [-1, 1] and scaled to the env's bounds; uniform random actions while the fleet is within
``learning_starts`` env steps; ``deterministic=True`` (evaluators) is the actor's action without
noise. No extras: the learner needs none.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np

from common.algorithms.acting import PolicyBase
from common.algorithms.actions import ActionScale, dims
from common.algorithms.contract import Columns
from common.algorithms.mlp import numpy_layers, numpy_mlp
from common.algorithms.td3.config import TD3Config
from common.algorithms.td3.networks import seeded_networks
from common.algorithms.weights import check_arrays, publish_arrays

NO_EXTRAS: Columns = {}


class TD3Policy(PolicyBase):
    """``seed`` initialises the actor (the learner's seed); ``act_seed`` seeds the noise rng."""

    cfg: TD3Config

    def setup(self, observation_space: gym.Space, action_space: gym.Space, seed: int) -> None:
        assert isinstance(action_space, gym.spaces.Box)
        cfg = self.cfg
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
        """Uniform random actions until the fleet has taken ``learning_starts`` env steps, then the
        actor's with Gaussian noise of std ``exploration_noise``."""
        left = max(0, self.cfg.learning_starts - fleet_env_steps)
        self.warmup = left > 0
        return {"warmup_steps_left": float(left), "exploration_noise": float(self.cfg.exploration_noise)}

    def act(self, obs: np.ndarray, *, deterministic: bool = False) -> tuple[np.ndarray, Columns]:
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        if self.warmup and not deterministic:
            return self.scale.to_env(self.rng.uniform(-1.0, 1.0, (len(x), self.act_dim))), NO_EXTRAS
        unit = np.tanh(numpy_mlp(self._layers, x, "relu").astype(np.float64))
        if not deterministic and self.cfg.exploration_noise > 0:
            unit = np.clip(unit + self.cfg.exploration_noise * self.rng.standard_normal(unit.shape), -1.0, 1.0)
        return self.scale.to_env(unit), NO_EXTRAS
