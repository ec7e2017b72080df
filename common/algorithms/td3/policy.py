"""TD3 acting, in numpy: tanh of the published actor, plus Gaussian exploration noise
(``exploration_noise``, in units of half the action range, from the policy's own rng, white or
coloured: ``noise_color``), clipped
to [-1, 1] and scaled to the env's bounds; uniform random actions while the fleet is within
``learning_starts`` env steps; ``deterministic=True`` (evaluators) is the actor's action without
noise. No extras: the learner needs none.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlfleet.common.algorithms.actions import BoundedActorPolicy
from rlfleet.common.algorithms.td3.networks import seeded_networks
from rlfleet.common.algorithms.weights import publish_arrays


class TD3Policy(BoundedActorPolicy):
    """``seed`` initialises the actor (the learner's seed); ``act_seed`` seeds the noise rng."""

    def actor_arrays(self, observation_space: gym.Space, action_space: gym.Space, seed: int) -> dict[str, np.ndarray]:
        return publish_arrays(seeded_networks(self.cfg, observation_space, action_space, seed).actor, "actor.")

    def exploration(self) -> dict[str, float]:
        return {"exploration_noise": float(self.cfg.exploration_noise)}

    def unit_actions(self, out: np.ndarray, deterministic: bool) -> np.ndarray:
        unit = np.tanh(out)
        if not deterministic and self.cfg.exploration_noise > 0:
            unit = np.clip(unit + self.cfg.exploration_noise * self.noise(unit.shape), -1.0, 1.0)
        return unit  # type: ignore[no-any-return]
