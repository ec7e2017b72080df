"""The DQN Q-network: an MLP torso with a dueling or a plain head.

The actor and the learner build the same module from the same config, so the
names of its state_dict are the names the paramserver publishes.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn


class QNetwork(nn.Module):
    """Q(s, .) for flat float inputs (any observation shape is flattened).

    Dueling (Wang et al. 2016): Q = V(s) + A(s, a) - mean_a A(s, a), which
    keeps V and A identifiable. ``hidden=[]`` gives a linear Q-function.
    """

    def __init__(self, obs_dim: int, num_actions: int, hidden: Sequence[int], dueling: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.torso = nn.Sequential(*layers)
        self.dueling = dueling
        if dueling:
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, num_actions)
        else:
            self.head = nn.Linear(width, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = self.torso(obs.flatten(1).float())
        if not self.dueling:
            return self.head(features)  # type: ignore[no-any-return]
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(dim=1, keepdim=True)  # type: ignore[no-any-return]


def obs_dim(observation_space: gym.Space) -> int:
    assert observation_space.shape is not None
    return int(np.prod(observation_space.shape, dtype=np.int64))


def build_q_network(
    hidden: Sequence[int], dueling: bool, observation_space: gym.Space, action_space: gym.Space
) -> QNetwork:
    assert isinstance(action_space, gym.spaces.Discrete)
    return QNetwork(obs_dim(observation_space), int(action_space.n), hidden, dueling)
