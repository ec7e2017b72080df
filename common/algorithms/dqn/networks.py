"""The DQN Q-network: an MLP or Nature CNN torso with a dueling or a plain head.

The actor and the learner build the same module from the same config, so the
names of its state_dict are the names the paramserver publishes.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlfleet.common.algorithms.cnn import NatureCNN
from rlfleet.common.algorithms.dqn.builder import check_env
from rlfleet.common.algorithms.dqn.config import DQNConfig
from rlfleet.common.algorithms.mlp import float32_head, seeded
from rlfleet.common.algorithms.torsos import choose_torso


class QNetwork(nn.Module):
    """Q(s, .) over an MLP torso (any observation shape flattened) or the Nature CNN (uint8 frames).

    Dueling (Wang et al. 2016): Q = V(s) + A(s, a) - mean_a A(s, a), which
    keeps V and A identifiable. ``hidden=[]`` gives a linear Q-function.
    """

    def __init__(self, obs_dim: int, num_actions: int, hidden: Sequence[int], dueling: bool,
                 image_shape: Sequence[int] | None = None) -> None:
        super().__init__()
        width = obs_dim
        self.torso: nn.Module
        if image_shape is not None:  # the Nature CNN: its 512 features feed the heads
            c, h, w = image_shape
            self.torso = NatureCNN(c, h, w)
            width = self.torso.features
        else:
            layers: list[nn.Module] = []
            for size in hidden:
                layers += [nn.Linear(width, size), nn.ReLU()]
                width = size
            self.torso = nn.Sequential(*layers)
        self.is_mlp = image_shape is None
        self.dueling = dueling
        if dueling:
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, num_actions)
        else:
            self.head = nn.Linear(width, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(obs, .) in float32; under bfloat16 autocast only the torso runs in bfloat16 (a bfloat16 head
        would round Q-values of ~100 to steps of 0.5)."""
        features = self.torso(obs.flatten(1).float() if self.is_mlp else obs)
        if not self.dueling:
            return float32_head(features, self.head.weight, self.head.bias)
        advantage = float32_head(features, self.advantage.weight, self.advantage.bias)
        value = float32_head(features, self.value.weight, self.value.bias)
        return value + advantage - advantage.mean(dim=1, keepdim=True)

    def numpy_layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(W^T, b) float32 copies per layer, for :func:`numpy_q`; a dueling head folded into one layer.

        V + A_j - mean_k A_k is linear in the features: one (features x actions) layer. MLP torsos only.
        """
        if not self.is_mlp:
            raise TypeError("numpy_layers: a CNN torso acts in torch")
        with torch.no_grad():
            layers: list[tuple[torch.Tensor, torch.Tensor]] = [
                (m.weight.t(), m.bias) for m in self.torso.modules() if isinstance(m, nn.Linear)]
            if self.dueling:
                adv_w, adv_b = self.advantage.weight, self.advantage.bias
                layers.append(((self.value.weight + adv_w - adv_w.mean(dim=0, keepdim=True)).t(),
                               self.value.bias + adv_b - adv_b.mean()))
            else:
                layers.append((self.head.weight.t(), self.head.bias))
            return [(np.array(w.cpu().numpy(), np.float32, order="C"), np.array(b.cpu().numpy(), np.float32))
                    for w, b in layers]


def numpy_q(layers: list[tuple[np.ndarray, np.ndarray]], obs: np.ndarray) -> np.ndarray:
    """Q(obs, .) in numpy from :meth:`QNetwork.numpy_layers`: for the few rows an actor acts on,
    a fifth of torch's per-call cost (~10 us against ~45 us for 4 CartPole rows)."""
    h = np.asarray(obs).reshape(len(obs), -1).astype(np.float32, copy=False)
    for w, b in layers[:-1]:
        h = h @ w
        h += b
        np.maximum(h, 0.0, out=h)
    w, b = layers[-1]
    q = h @ w
    q += b
    return q


def obs_dim(observation_space: gym.Space) -> int:
    assert observation_space.shape is not None
    return int(np.prod(observation_space.shape, dtype=np.int64))


def build_q_network(
    hidden: Sequence[int], dueling: bool, observation_space: gym.Space, action_space: gym.Space,
    torso: str = "auto",
) -> QNetwork:
    assert isinstance(action_space, gym.spaces.Discrete)
    cnn = choose_torso(torso, observation_space, "dqn", "the env") == "nature_cnn"
    return QNetwork(obs_dim(observation_space), int(action_space.n), hidden, dueling,
                    image_shape=tuple(observation_space.shape) if cnn else None)  # type: ignore[arg-type]


def seeded_q_network(cfg: DQNConfig, observation_space: gym.Space, action_space: gym.Space, seed: int) -> QNetwork:
    """The Q-network of ``cfg``, initialised from ``seed`` without disturbing anyone else's torch RNG:
    a learner and a policy built with the same seed start from the same weights."""
    check_env(cfg, observation_space, action_space)
    return seeded(seed, lambda: build_q_network(cfg.hidden, cfg.dueling, observation_space, action_space, cfg.torso))


def n_step_target(
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_q_online: torch.Tensor,
    next_q_target: torch.Tensor,
    double: bool = True,
) -> torch.Tensor:
    """reward + discount * Q_target(s', a*), a* = argmax Q_online(s') (double) or argmax Q_target(s').

    A transition's ``discount`` already holds gamma^k (0 after a termination).
    """
    if double:
        best = next_q_online.argmax(dim=1, keepdim=True)
        bootstrap = next_q_target.gather(1, best).squeeze(1)
    else:
        bootstrap = next_q_target.max(dim=1).values
    return reward + discount * bootstrap
