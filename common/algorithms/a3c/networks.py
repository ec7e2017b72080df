"""A3C's network: an MLP torso under a policy head (logits) and a value head (shared, as in A3C,
or a torso each with ``shared_torso: false``, as SB3's A2C).

Orthogonal initialisation as SB3's A2C (gain sqrt(2) on the torso, 0.01 on the policy head,
1 on the value head, zero biases). Published names are the module's: ``torso.{2i}.weight``
[out, in] / ``.bias`` (and ``v_torso.*`` when not shared), ``pi.weight``, ``pi.bias``, ``v.weight``,
``v.bias``; a gradient has the
name of its parameter, so a worker's push is checked against the same layout.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlfleet.common.algorithms.a3c.config import A3CConfig
from rlfleet.common.algorithms.mlp import ACTIVATIONS, seeded


class SharedActorCritic(nn.Module):
    def __init__(self, cfg: A3CConfig, observation_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__()
        assert observation_space.shape is not None
        inputs = int(np.prod(observation_space.shape, dtype=np.int64))
        self.torso = torso(inputs, cfg.hidden, cfg.activation)
        # separate torsos: the value loss no longer shapes the policy's features
        self.v_torso = None if cfg.shared_torso else torso(inputs, cfg.hidden, cfg.activation)
        width = cfg.hidden[-1] if cfg.hidden else inputs
        self.pi = nn.Linear(width, int(action_space.n))  # type: ignore[attr-defined]
        self.v = nn.Linear(width, 1)
        for head, gain in ((self.pi, 0.01), (self.v, 1.0)):
            nn.init.orthogonal_(head.weight, gain)
            nn.init.zeros_(head.bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, A], V [B])."""
        x = obs.flatten(1)
        h = self.torso(x)
        return self.pi(h), self.v(h if self.v_torso is None else self.v_torso(x)).squeeze(1)


def torso(inputs: int, hidden: list[int], activation: str) -> nn.Sequential:
    """Linear layers of ``hidden`` widths, each followed by ``activation`` (gain sqrt(2) orthogonal init)."""
    layers: list[nn.Module] = []
    width = inputs
    for size in hidden:
        linear = nn.Linear(width, size)
        nn.init.orthogonal_(linear.weight, math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers += [linear, ACTIVATIONS[activation]()]
        width = size
    return nn.Sequential(*layers)


def seeded_network(cfg: A3CConfig, observation_space: gym.Space, action_space: gym.Space,
                   seed: int) -> SharedActorCritic:
    """The network initialised from ``seed`` (every worker the same) without touching the global RNG."""
    return seeded(seed, lambda: SharedActorCritic(cfg, observation_space, action_space))
