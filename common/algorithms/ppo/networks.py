"""PPO's networks: separate actor and critic MLPs (SB3's default policy), or for images one Nature
CNN under both heads, a state-independent log-std for continuous actions, and running observation
normalisation.

Orthogonal initialisation as in SB3 and CleanRL: gain sqrt(2) on hidden layers,
0.01 on the policy head (near-uniform first policy), 1 on the value head, zero biases.

The learner trains actor and critic as one :class:`TwinMLP`: their hidden layers (same widths)
are stacked and run as one batched matmul per layer, which halves the kernel launches of a
minibatch step (on 64-row minibatches the launches, not the arithmetic, are the cost). What
is published keeps the plain layout of two ``nn.Sequential`` MLPs (``actor.0.weight`` [out, in],
...), which acting reads in numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlfleet.common.algorithms.cnn import NatureCNN
from rlfleet.common.algorithms.mlp import TwinMLP, mlp, seeded
from rlfleet.common.algorithms.ppo.config import PPOConfig
from rlfleet.common.algorithms.torsos import choose_torso
from rlfleet.common.algorithms.weights import check_arrays, load_arrays, publish_arrays

LOG_2PI = math.log(2 * math.pi)


class PPONetworks(nn.Module):
    """actor(obs) -> logits (Discrete) or Gaussian mean (Box); critic(obs) -> V; log_std (Box only).

    Observations come in normalised (see :class:`RunningMeanStd`) and flat. ``arrays()`` gives
    the published layout: ``actor.{2i}.weight``/``.bias`` and ``critic.{2i}...`` as two
    ``nn.Sequential`` MLPs would name them, and ``log_std``.
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
        actor = mlp(obs_dim, cfg.hidden, outputs, cfg.activation, 0.01)
        critic = mlp(obs_dim, cfg.hidden, 1, cfg.activation, 1.0)
        self.twin = TwinMLP(actor, critic, cfg.activation)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((outputs,), float(cfg.log_std_init)))

    def actor(self, obs: torch.Tensor) -> torch.Tensor:
        return self.twin.one(obs.flatten(1), 0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.twin.one(obs.flatten(1), 1).squeeze(1)

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log pi(action | obs), the policy's entropy and V(obs), one per row, in one pass."""
        out, value = self.twin(obs.flatten(1).float())
        return (*distribution_terms(out, action, self.discrete, getattr(self, "log_std", None)), value.squeeze(1))

    def _published(self) -> dict[str, torch.Tensor]:
        """The parameters (views of them) under their published names."""
        named: dict[str, torch.Tensor] = {}
        for index, prefix in ((0, "actor"), (1, "critic")):
            for i, (weight, bias) in enumerate(self.twin.layers(index)):
                named[f"{prefix}.{2 * i}.weight"], named[f"{prefix}.{2 * i}.bias"] = weight, bias
        if not self.discrete:
            named["log_std"] = self.log_std
        return named

    def arrays(self) -> dict[str, np.ndarray]:
        """CPU float32 copies in the published layout."""
        return {key: np.ascontiguousarray(value.detach().to("cpu", torch.float32, copy=True).numpy())
                for key, value in self._published().items()}

    def load_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """The inverse of :meth:`arrays`: names and shapes checked before any is copied."""
        own = self._published()
        check_arrays({key: tuple(value.shape) for key, value in own.items()}, arrays)
        with torch.no_grad():
            for key, value in own.items():
                value.copy_(torch.as_tensor(np.asarray(arrays[key], np.float32)))


class PPOCnnNetworks(nn.Module):
    """Image observations: one Nature CNN (uint8 frames, scaled on the device) under an actor head (gain
    0.01) and a critic head (gain 1), as CleanRL's and SB3's Atari PPO. The interface of
    :class:`PPONetworks`; published as its state_dict (acting runs the module in torch)."""

    def __init__(self, cfg: PPOConfig, observation_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__()
        assert observation_space.shape is not None
        c, h, w = observation_space.shape
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        outputs = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))  # type: ignore[attr-defined, arg-type]
        self.torso = NatureCNN(c, h, w)
        self.actor_head = nn.Linear(self.torso.features, outputs)
        self.critic_head = nn.Linear(self.torso.features, 1)
        for head, gain in ((self.actor_head, 0.01), (self.critic_head, 1.0)):
            nn.init.orthogonal_(head.weight, gain)
            nn.init.zeros_(head.bias)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((outputs,), float(cfg.log_std_init)))

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor output, V) from one pass of the torso."""
        features = self.torso(obs)
        return self.actor_head(features), self.critic_head(features).squeeze(1)

    def actor(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor_head(self.torso(obs))  # type: ignore[no-any-return]

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic_head(self.torso(obs)).squeeze(1)  # type: ignore[no-any-return]

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, value = self.heads(obs)
        return (*distribution_terms(out, action, self.discrete, getattr(self, "log_std", None)), value)

    def arrays(self) -> dict[str, np.ndarray]:
        return publish_arrays(self)

    def load_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        load_arrays(self, arrays)


def distribution_terms(out: torch.Tensor, action: torch.Tensor, discrete: bool, log_std: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(action) and the entropy, per row, of a Categorical over logits ``out`` or a diagonal Gaussian
    of mean ``out`` and ``log_std``."""
    if discrete:
        logp_all = torch.log_softmax(out, dim=1)
        logp = logp_all.gather(1, action.long().reshape(-1, 1)).squeeze(1)
        return logp, -(logp_all.exp() * logp_all).sum(dim=1)
    assert log_std is not None
    action = action.reshape(out.shape)
    log_std = log_std.expand_as(out)
    z = (action - out) * torch.exp(-log_std)
    logp = (-0.5 * z.pow(2) - log_std - 0.5 * LOG_2PI).sum(dim=1)
    return logp, (0.5 + 0.5 * LOG_2PI + log_std).sum(dim=1)


def seeded_networks(cfg: PPOConfig, observation_space: gym.Space, action_space: gym.Space,
                    seed: int) -> PPONetworks | PPOCnnNetworks:
    """The networks initialised from ``seed`` without disturbing anyone else's torch RNG."""
    cnn = choose_torso(cfg.torso, observation_space, cfg.name, "the env") == "nature_cnn"
    return seeded(seed, lambda: (PPOCnnNetworks if cnn else PPONetworks)(cfg, observation_space, action_space))


class RunningMeanStd:
    """Running mean and variance of observations (parallel-variance update, as SB3's VecNormalize)."""

    KEYS = ("obs_norm.mean", "obs_norm.var", "obs_norm.count")  # as published with the weights

    def __init__(self, shape: tuple[int, ...], clip: float) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4
        self.clip = clip

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64).reshape(-1, *self.mean.shape)
        self.update_moments(x.mean(axis=0) if len(x) else self.mean, x.var(axis=0) if len(x) else self.var, len(x))

    def update_sums(self, n: float, total: np.ndarray, squares: np.ndarray) -> None:
        """The same from a count, a sum and a sum of squares (gathered over data-parallel ranks)."""
        if n > 0:
            mean = total / n
            self.update_moments(mean, np.maximum(squares / n - mean * mean, 0.0), n)

    def update_moments(self, batch_mean: np.ndarray, batch_var: np.ndarray, n: float) -> None:
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
