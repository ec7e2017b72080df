"""The policy base: what every algorithm's policy holds before its networks (RLlib's RLModule.setup).

A policy (actors, evaluators, ``rlfleet eval``) is built from the experiment seed (``seed``: the
learner's starting weights, so actors start where it starts) and samples with its own rng
(``act_seed``: each actor's, default ``seed``). The base keeps the config, the device and that rng,
then calls :meth:`PolicyBase.setup` to build the rest. Policies with no exploration state and no
initial priorities keep the defaults of :meth:`explore` and :meth:`priorities`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlfleet.common.algorithms.contract import SeedLike
from rlfleet.common.algorithms.device import resolve_device


class PolicyBase:
    def __init__(self, cfg: Any, observation_space: Any, action_space: Any, *, device: str | torch.device = "cpu",
                 seed: int = 0, act_seed: SeedLike = None) -> None:
        self.cfg = cfg
        self.device = resolve_device(device)
        self.rng = np.random.default_rng(seed if act_seed is None else act_seed)
        self.setup(observation_space, action_space, seed)

    def setup(self, observation_space: Any, action_space: Any, seed: int) -> None:
        """Build the networks (initialised from ``seed``) and whatever acting keeps."""
        raise NotImplementedError

    def explore(self, actor_index: int, num_actors: int, fleet_env_steps: int) -> dict[str, float]:
        """No exploration state of its own: it explores by sampling its policy."""
        return {}

    def priorities(self, items: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """No initial priorities: a prioritized table gives new items its highest."""
        return None
