"""A3C acting, in numpy: a Categorical over the policy head's logits (evaluators: the argmax).

A worker acts with the weights it last pulled and computes its gradients against the
same version (see :mod:`.worker`); nothing of the acting step is needed by the loss, so
``act`` returns no extras.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np

from rlfleet.common.algorithms.a3c.networks import seeded_network
from rlfleet.common.algorithms.acting import PolicyBase
from rlfleet.common.algorithms.contract import Columns
from rlfleet.common.algorithms.weights import check_arrays, publish_arrays


class A3CPolicy(PolicyBase):
    """``seed`` initialises the network (every worker's starting weights); ``act_seed`` seeds the sampling."""

    def setup(self, observation_space: gym.Space, action_space: gym.Space, seed: int) -> None:
        cfg = self.cfg
        self.net = seeded_network(cfg, observation_space, action_space, seed)
        arrays = publish_arrays(self.net)
        self._shapes = {key: value.shape for key, value in arrays.items()}
        self._use(arrays)

    def _use(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._torso = []
        i = 0
        while f"torso.{i}.weight" in arrays:
            self._torso.append((np.array(np.asarray(arrays[f"torso.{i}.weight"]).T, np.float32, order="C"),
                                np.array(arrays[f"torso.{i}.bias"], np.float32)))
            i += 2
        self._pi = (np.array(np.asarray(arrays["pi.weight"]).T, np.float32, order="C"),
                    np.array(arrays["pi.bias"], np.float32))

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        check_arrays(self._shapes, weights)
        self._use(weights)

    def logits(self, obs: np.ndarray) -> np.ndarray:
        h = np.asarray(obs, np.float32).reshape(len(obs), -1)
        for w, b in self._torso:
            h = h @ w
            h += b
            if self.cfg.activation == "tanh":
                np.tanh(h, out=h)
            else:
                np.maximum(h, 0.0, out=h)
        w, b = self._pi
        return h @ w + b

    def act(self, obs: np.ndarray, *, deterministic: bool = False) -> tuple[np.ndarray, Columns]:
        logits = self.logits(obs)
        if deterministic:
            return logits.argmax(axis=1).astype(np.int64), {}
        # Gumbel-max: one draw per row, no normalisation needed
        gumbel = -np.log(-np.log(self.rng.random(logits.shape)))
        return (logits + gumbel).argmax(axis=1).astype(np.int64), {}

