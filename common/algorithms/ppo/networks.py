"""PPO's networks: separate actor and critic MLPs (SB3's default policy), a state-independent
log-std for continuous actions, and running observation normalisation.

Orthogonal initialisation as in SB3 and CleanRL: gain sqrt(2) on hidden layers,
0.01 on the policy head (near-uniform first policy), 1 on the value head, zero biases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from common.algorithms.ppo.config import PPOConfig

NumpyLayers = list[tuple[np.ndarray, np.ndarray]]
ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}
LOG_2PI = math.log(2 * math.pi)


def mlp(inputs: int, hidden: Sequence[int], outputs: int, activation: str, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = inputs
    for size in hidden:
        linear = nn.Linear(width, size)
        nn.init.orthogonal_(linear.weight, math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers += [linear, ACTIVATIONS[activation]()]
        width = size
    head = nn.Linear(width, outputs)
    nn.init.orthogonal_(head.weight, out_gain)
    nn.init.zeros_(head.bias)
    return nn.Sequential(*layers, head)


class PPONetworks(nn.Module):
    """actor(obs) -> logits (Discrete) or Gaussian mean (Box); critic(obs) -> V; log_std (Box only).

    Observations come in normalised (see :class:`RunningMeanStd`) and flat.
    """

    def __init__(self, cfg: PPOConfig, observation_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__()
        assert observation_space.shape is not None
        obs_dim = int(np.prod(observation_space.shape, dtype=np.int64))
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if self.discrete:
            outputs = int(action_space.n)  # type: ignore[attr-defined]
        else:
            assert action_space.shape is not None
            outputs = int(np.prod(action_space.shape, dtype=np.int64))
        self.actor = mlp(obs_dim, cfg.hidden, outputs, cfg.activation, 0.01)
        self.critic = mlp(obs_dim, cfg.hidden, 1, cfg.activation, 1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((outputs,), float(cfg.log_std_init)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs.flatten(1)).squeeze(1)  # type: ignore[no-any-return]

    def logp_entropy(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(action | obs) and the policy's entropy at obs, one per row."""
        out = self.actor(obs.flatten(1))
        if self.discrete:
            logp_all = torch.log_softmax(out, dim=1)
            logp = logp_all.gather(1, action.long().reshape(-1, 1)).squeeze(1)
            entropy = -(logp_all.exp() * logp_all).sum(dim=1)
            return logp, entropy
        action = action.reshape(out.shape)
        log_std = self.log_std.expand_as(out)
        z = (action - out) * torch.exp(-log_std)
        logp = (-0.5 * z.pow(2) - log_std - 0.5 * LOG_2PI).sum(dim=1)
        entropy = (0.5 + 0.5 * LOG_2PI + log_std).sum(dim=1)
        return logp, entropy


def seeded_networks(cfg: PPOConfig, observation_space: gym.Space, action_space: gym.Space, seed: int) -> PPONetworks:
    """The networks initialised from ``seed`` without disturbing anyone else's torch RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return PPONetworks(cfg, observation_space, action_space)


def numpy_layers(net: nn.Sequential) -> NumpyLayers:
    """(W^T, b) float32 copies per Linear of ``net``, for :func:`numpy_mlp`."""
    with torch.no_grad():
        return [(np.array(m.weight.t().cpu().numpy(), np.float32, order="C"), m.bias.cpu().numpy().astype(np.float32))
                for m in net if isinstance(m, nn.Linear)]


def numpy_mlp(layers: NumpyLayers, x: np.ndarray, activation: str) -> np.ndarray:
    """The MLP of :func:`mlp` in numpy: acting on a few rows costs far less than a torch call."""
    h = x
    for i, (w, b) in enumerate(layers):
        h = h @ w
        h += b
        if i < len(layers) - 1:
            if activation == "tanh":
                np.tanh(h, out=h)
            else:
                np.maximum(h, 0.0, out=h)
    return h


class RunningMeanStd:
    """Running mean and variance of observations (parallel-variance update, as SB3's VecNormalize)."""

    def __init__(self, shape: tuple[int, ...], clip: float) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4
        self.clip = clip

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64).reshape(-1, *self.mean.shape)
        batch_mean, batch_var, n = x.mean(axis=0), x.var(axis=0), len(x)
        if n == 0:
            return
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total

    def normalize(self, x: np.ndarray) -> np.ndarray:
        return normalize(x, self.mean, self.var, self.clip)

    def arrays(self) -> dict[str, np.ndarray]:
        """As published with the weights (float32)."""
        return {"obs_norm.mean": self.mean.astype(np.float32), "obs_norm.var": self.var.astype(np.float32),
                "obs_norm.count": np.array([self.count], np.float32)}


def normalize(x: np.ndarray, mean: np.ndarray, var: np.ndarray, clip: float) -> np.ndarray:
    """(x - mean) / sqrt(var + 1e-8), clipped to +-clip, float32."""
    out = (np.asarray(x, np.float32) - mean.astype(np.float32)) / np.sqrt(var.astype(np.float32) + 1e-8)
    return np.clip(out, -clip, clip).astype(np.float32, copy=False)
