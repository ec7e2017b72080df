"""TD3's networks: a deterministic tanh actor, twin Q critics, and a target of each.

Actions live in [-1, 1] inside the networks and are scaled to the env's bounds only at the env
(SAC's :class:`~rlfleet.common.algorithms.sac.networks.ActionScale`), so the noises of the config are in
units of half the action range, as CleanRL scales them. The actor is an MLP from the observation
to the action's pre-tanh value (:func:`~rlfleet.common.algorithms.mlp.mlp`, published and acted on in numpy);
the critics are a :class:`~rlfleet.common.algorithms.mlp.TwinMLP` over [observation, action in [-1, 1]].
PyTorch's default initialisation, as SB3's and CleanRL's TD3.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from rlfleet.common.algorithms.actions import dims
from rlfleet.common.algorithms.mlp import TwinMLP, mlp, seeded, twin_q
from rlfleet.common.algorithms.td3.config import TD3Config


def twin_critic(obs_dim: int, act_dim: int, widths: list[int]) -> TwinMLP:
    return TwinMLP(mlp(obs_dim + act_dim, widths, 1, "relu"), mlp(obs_dim + act_dim, widths, 1, "relu"), "relu")


class TD3Networks(nn.Module):
    """``actor`` (published), ``critic`` (twin Q), and ``actor_target``, ``critic_target`` (follow by Polyak)."""

    def __init__(self, cfg: TD3Config, observation_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__()
        obs_dim, act_dim = dims(observation_space, action_space)
        widths = cfg.critic_hidden if cfg.critic_hidden is not None else cfg.hidden
        self.actor = mlp(obs_dim, cfg.hidden, act_dim, "relu")
        self.critic = twin_critic(obs_dim, act_dim, widths)
        self.actor_target = mlp(obs_dim, cfg.hidden, act_dim, "relu").requires_grad_(False)
        self.critic_target = twin_critic(obs_dim, act_dim, widths).requires_grad_(False)
        self.actor_target.load_state_dict(self.actor.state_dict())
        self.critic_target.load_state_dict(self.critic.state_dict())

    @staticmethod
    def act(actor: nn.Module, obs: torch.Tensor) -> torch.Tensor:
        """The action of ``actor`` (the actor or its target) in [-1, 1]."""
        return torch.tanh(actor(obs.flatten(1)))

    q = staticmethod(twin_q)  # Q1 and Q2 of a critic (the critic or its target)


def seeded_networks(cfg: TD3Config, observation_space: gym.Space, action_space: gym.Space, seed: int) -> TD3Networks:
    """The networks initialised from ``seed`` without disturbing anyone else's torch RNG."""
    return seeded(seed, lambda: TD3Networks(cfg, observation_space, action_space))
