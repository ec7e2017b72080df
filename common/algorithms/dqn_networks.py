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


    def numpy_layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(W^T, b) float32 copies per layer, for :func:`numpy_q`; a dueling head folded into one layer.

        V + A_j - mean_k A_k is linear in the features: one (features x actions) layer.
        """
        with torch.no_grad():
            layers: list[tuple[torch.Tensor, torch.Tensor]] = [
                (m.weight.t(), m.bias) for m in self.torso if isinstance(m, nn.Linear)]
            if self.dueling:
                adv_w, adv_b = self.advantage.weight, self.advantage.bias
                layers.append(((self.value.weight + adv_w - adv_w.mean(dim=0, keepdim=True)).t(),
                               self.value.bias + adv_b - adv_b.mean()))
            else:
                layers.append((self.head.weight.t(), self.head.bias))
            return [(np.array(w.cpu().numpy(), np.float32, order="C"), np.array(b.cpu().numpy(), np.float32))
                    for w, b in layers]

    # -- hand-written backprop for the learner's update (checked against autograd in tests/test_dqn.py) --
    def forward_keep(self, obs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Q(obs, .) without autograd, and the activations :meth:`backward_into` needs.

        One small MLP update on CPU is mostly per-op overhead; autograd's graph
        about doubles it. This forward records nothing; the backward below is
        a dozen matmuls and masks.
        """
        with torch.no_grad():
            h = obs.flatten(1).float()
            acts = [h]
            for layer in self.torso:
                if isinstance(layer, nn.Linear):
                    h = torch.addmm(layer.bias, h, layer.weight.t())
                else:
                    h = h.relu_()
                    acts.append(h)
            if not self.dueling:
                return torch.addmm(self.head.bias, h, self.head.weight.t()), acts
            advantage = torch.addmm(self.advantage.bias, h, self.advantage.weight.t())
            q = advantage.sub_(advantage.mean(dim=1, keepdim=True)).add_(
                torch.addmm(self.value.bias, h, self.value.weight.t()))
            return q, acts

    def backward_into(self, acts: list[torch.Tensor], grad_q: torch.Tensor) -> None:
        """Set every parameter's ``.grad`` to d(loss)/d(param), given d(loss)/dQ [B, actions]
        and the activations of :meth:`forward_keep` (what ``loss.backward()`` would give)."""
        with torch.no_grad():
            h = acts[-1]
            if self.dueling:
                grad_v = grad_q.sum(dim=1, keepdim=True)  # Q = V + A - mean(A)
                grad_a = grad_q - grad_q.mean(dim=1, keepdim=True)
                self.value.weight.grad = grad_v.t() @ h
                self.value.bias.grad = grad_v.sum(dim=0)
                self.advantage.weight.grad = grad_a.t() @ h
                self.advantage.bias.grad = grad_a.sum(dim=0)
                grad_h = torch.addmm(grad_v @ self.value.weight, grad_a, self.advantage.weight)
            else:
                self.head.weight.grad = grad_q.t() @ h
                self.head.bias.grad = grad_q.sum(dim=0)
                grad_h = grad_q @ self.head.weight
            linears = [m for m in self.torso if isinstance(m, nn.Linear)]
            for i in range(len(linears) - 1, -1, -1):
                grad_h = grad_h.mul_(acts[i + 1] > 0)  # through the ReLU after linear i
                linears[i].weight.grad = grad_h.t() @ acts[i]
                linears[i].bias.grad = grad_h.sum(dim=0)
                if i:
                    grad_h = grad_h @ linears[i].weight


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
    hidden: Sequence[int], dueling: bool, observation_space: gym.Space, action_space: gym.Space
) -> QNetwork:
    assert isinstance(action_space, gym.spaces.Discrete)
    return QNetwork(obs_dim(observation_space), int(action_space.n), hidden, dueling)
