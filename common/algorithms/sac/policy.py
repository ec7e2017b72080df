"""SAC acting, in numpy: tanh(mean + std * noise) of the published actor (the noise white or
coloured: ``noise_color``), scaled to the env's bounds; uniform random actions while the fleet is
within ``learning_starts`` env steps; ``deterministic=True`` (evaluators) is tanh(mean). No extras:
the learner needs none.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlfleet.common.algorithms.actions import BoundedActorPolicy
from rlfleet.common.algorithms.sac.networks import seeded_networks
from rlfleet.common.algorithms.weights import publish_arrays


class SACPolicy(BoundedActorPolicy):
    """``seed`` initialises the actor (the learner's seed); ``act_seed`` seeds the sampling rng."""

    def actor_arrays(self, observation_space: gym.Space, action_space: gym.Space, seed: int) -> dict[str, np.ndarray]:
        return publish_arrays(seeded_networks(self.cfg, observation_space, action_space, seed).actor, "actor.")

    def unit_actions(self, out: np.ndarray, deterministic: bool) -> np.ndarray:
        mean, log_std = out[:, :self.act_dim], out[:, self.act_dim:]
        if deterministic:
            return np.tanh(mean)  # type: ignore[no-any-return]
        std = np.exp(np.clip(log_std, self.cfg.log_std_min, self.cfg.log_std_max))
        return np.tanh(mean + std * self.noise(mean.shape))  # type: ignore[no-any-return]
