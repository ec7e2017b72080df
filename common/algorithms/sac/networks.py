"""SAC's networks: a tanh-squashed diagonal Gaussian actor and twin Q critics.

The actor is one MLP from the observation to [mean, log_std] (2 x action dims, log_std
clamped); actions live in [-1, 1] inside the networks and are scaled to the env's bounds
(:class:`rlfleet.common.algorithms.actions.ActionScale`) only at the env. The critics are a :class:`TwinMLP` over
[observation, action in [-1, 1]]: both Q-functions in one batched matmul per layer.
PyTorch's default initialisation, as SB3's SAC.
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from rlfleet.common.algorithms.actions import dims
from rlfleet.common.algorithms.mlp import TwinMLP, float32_head, mlp, seeded, twin_q
from rlfleet.common.algorithms.sac.config import SACConfig

LOG_2PI = math.log(2 * math.pi)
LOG_2 = math.log(2.0)


def squashed_sample(mean: torch.Tensor, log_std: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a = tanh(mean + std * eps) in [-1, 1] and log pi(a), reparameterised, with the tanh change of
    variables (log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|)."""
    u = mean + log_std.exp() * eps
    logp = (-0.5 * eps.pow(2) - log_std - 0.5 * LOG_2PI).sum(1)
    logp = logp - (2.0 * (LOG_2 - u - F.softplus(-2.0 * u))).sum(1)
    return torch.tanh(u), logp


class SACNetworks(nn.Module):
    """``actor`` (published), ``critic`` (twin Q) and ``critic_target`` (follows by Polyak)."""

    def __init__(self, cfg: SACConfig, observation_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__()
        obs_dim, act_dim = dims(observation_space, action_space)
        self.cfg = cfg
        self.actor = mlp(obs_dim, cfg.hidden, 2 * act_dim, "relu")
        widths = cfg.critic_hidden if cfg.critic_hidden is not None else cfg.hidden
        self.critic = TwinMLP(mlp(obs_dim + act_dim, widths, 1, "relu"), mlp(obs_dim + act_dim, widths, 1, "relu"),
                              "relu")
        self.critic_target = TwinMLP(mlp(obs_dim + act_dim, widths, 1, "relu"),
                                     mlp(obs_dim + act_dim, widths, 1, "relu"), "relu").requires_grad_(False)
        self.critic_target.load_state_dict(self.critic.state_dict())
        # the actor's hidden layers and its head, held once (in a tuple: not registered again as modules)
        *body, head = self.actor
        assert isinstance(head, nn.Linear)
        self._actor_parts: tuple[tuple[nn.Module, ...], nn.Linear] = (tuple(body), head)

    def mean_log_std(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        body, head = self._actor_parts
        h = obs.flatten(1)
        for layer in body:
            h = layer(h)
        mean, log_std = float32_head(h, head.weight, head.bias).chunk(2, dim=1)
        return mean, log_std.clamp(self.cfg.log_std_min, self.cfg.log_std_max)

    q = staticmethod(twin_q)  # Q1 and Q2 of a critic (the critic or its target)


def seeded_networks(cfg: SACConfig, observation_space: gym.Space, action_space: gym.Space, seed: int) -> SACNetworks:
    """The networks initialised from ``seed`` without disturbing anyone else's torch RNG."""
    return seeded(seed, lambda: SACNetworks(cfg, observation_space, action_space))
