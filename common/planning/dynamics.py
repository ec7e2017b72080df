"""The world model of parallel Dyna-Q: (observation, action) -> next observation, reward, termination.

An MLP predicts the change of the observation (the delta), the reward, both in
units of their standard deviation over the training data, and a termination
logit. It learns from the real table's one-step transitions
(``obs, action, reward, next_obs, discount``; ``discount == 0`` marks a
termination). Normalisation statistics are buffers of the network, so the
published arrays are the whole model: planners need nothing else.

A fixed fraction of the transitions, chosen by replay key (:func:`holdout_mask`),
is never trained on: the model's validation error on them is what the gate of
the learner and the planners reads. That error is the mean over the next
observation's dimensions and the reward of the squared error in standard
deviations (1: no better than predicting the mean), plus the termination error
rate; it is published with the weights as ``meta.val_error`` (``inf`` until
``MIN_VALIDATION`` held-out transitions were seen).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlfleet.common.algorithms.device import resolve_device, to_device
from rlfleet.common.algorithms.mlp import mlp
from rlfleet.common.algorithms.optim import ClippedAdam
from rlfleet.common.algorithms.weights import load_arrays, publish_arrays
from rlfleet.common.config.planning import WorldModelConfig

VAL_ERROR = "meta.val_error"  # the published validation error (float32 scalar array)
MIN_VALIDATION = 200  # held-out transitions seen before the validation error counts
VAL_EMA = 0.05  # weight of the newest held-out batch in the validation error
MOMENTS_EMA = 0.01  # weight of each training batch in the normalisation statistics (after the first)
TINY_STD = 1e-6  # a target with less spread than this is constant: its unit is 1


class ModelMismatch(ValueError):
    """The env's spaces do not fit a world model, or published weights do not fit this one."""


def model_spaces(obs_space: gym.Space[Any], act_space: gym.Space[Any]) -> tuple[int, int, bool]:
    """(observation size, action input size, discrete) for a 1-D Box observation; ModelMismatch otherwise."""
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ModelMismatch(f"observation space {obs_space}: the world model predicts vectors; allowed: a 1-D Box"
                            " (image observations are not planned on)")
    if isinstance(act_space, gym.spaces.Discrete):
        return int(obs_space.shape[0]), int(act_space.n), True
    if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        return int(obs_space.shape[0]), int(act_space.shape[0]), False
    raise ModelMismatch(f"action space {act_space}: allowed: Discrete or a 1-D Box")


def holdout_mask(keys: np.ndarray, fraction: float) -> np.ndarray:
    """True for the keys of the validation split: a fixed ``fraction`` of all keys, spread evenly."""
    mixed = (np.asarray(keys, np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return mixed.astype(np.float64) / float(1 << 24) < fraction


class DynamicsNet(nn.Module):
    obs_mean: torch.Tensor  # normalisation statistics: buffers, published with the weights
    obs_std: torch.Tensor
    delta_mean: torch.Tensor
    delta_std: torch.Tensor
    reward_mean: torch.Tensor
    reward_std: torch.Tensor

    def __init__(self, obs_dim: int, act_dim: int, discrete: bool, hidden: list[int]) -> None:
        super().__init__()
        self.obs_dim, self.act_dim, self.discrete = obs_dim, act_dim, discrete
        self.body = mlp(obs_dim + act_dim, hidden, obs_dim + 2, "relu")
        for name, size in (("obs_mean", obs_dim), ("obs_std", obs_dim), ("delta_mean", obs_dim),
                           ("delta_std", obs_dim), ("reward_mean", 1), ("reward_std", 1)):
            self.register_buffer(name, torch.zeros(size) if name.endswith("mean") else torch.ones(size))

    def inputs(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = (obs - self.obs_mean) / self.obs_std
        a = F.one_hot(action.long(), self.act_dim).float() if self.discrete else action.float()
        return torch.cat([x, a], dim=1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normalised delta [B, D], normalised reward [B], termination logit [B]."""
        out = self.body(self.inputs(obs, action))
        return out[:, :self.obs_dim], out[:, self.obs_dim], out[:, self.obs_dim + 1]

    @torch.no_grad()
    def predict(self, obs: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Next observations (float32), rewards (float32) and terminations (bool) of a batch."""
        o = torch.as_tensor(np.asarray(obs, np.float32))
        delta, reward, logit = self(o, torch.as_tensor(np.asarray(action)))
        next_obs = o + delta * self.delta_std + self.delta_mean
        reward = reward * self.reward_std + self.reward_mean
        return next_obs.numpy(), reward.numpy().astype(np.float32), (logit > 0).numpy()


def make_dynamics_model(cfg: WorldModelConfig, obs_space: gym.Space[Any], act_space: gym.Space[Any]) -> DynamicsNet:
    obs_dim, act_dim, discrete = model_spaces(obs_space, act_space)
    return DynamicsNet(obs_dim, act_dim, discrete, list(cfg.hidden))


def load_dynamics_model(net: DynamicsNet, arrays: Mapping[str, np.ndarray]) -> float:
    """Copy published arrays into ``net``; return their validation error. ModelMismatch if they do not fit."""
    arrays = dict(arrays)
    val = arrays.pop(VAL_ERROR, None)
    try:
        load_arrays(net, arrays)
    except ValueError as exc:
        raise ModelMismatch(f"world model weights do not fit this env's model: {exc}") from None
    return float("inf") if val is None else float(np.asarray(val).reshape(()))


def _unit(std: torch.Tensor) -> torch.Tensor:
    return torch.where(std < TINY_STD, torch.ones_like(std), std)


class DynamicsLearner:
    """Trains a :class:`DynamicsNet` on sampled real transitions; no sockets."""

    def __init__(self, cfg: WorldModelConfig, obs_space: gym.Space[Any], act_space: gym.Space[Any],
                 device: str | torch.device = "auto", seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.cfg = cfg
        self.device = resolve_device(device)
        self.net = make_dynamics_model(cfg, obs_space, act_space).to(self.device)
        self.opt = ClippedAdam(self.net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.num_updates = 0
        self.val_error = float("inf")
        self.val_seen = 0  # held-out transitions seen
        self._moments = False  # normalisation statistics set from a first batch

    def _targets(self, b: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return b["next_obs"] - b["obs"], b["reward"], (b["discount"] == 0).float()

    @torch.no_grad()
    def _update_moments(self, b: Mapping[str, torch.Tensor]) -> None:
        delta, reward, _ = self._targets(b)
        w = 1.0 if not self._moments else MOMENTS_EMA
        self._moments = True
        n = self.net
        for mean, std, x in ((n.obs_mean, n.obs_std, b["obs"]), (n.delta_mean, n.delta_std, delta),
                             (n.reward_mean, n.reward_std, reward.reshape(-1, 1))):
            mean.mul_(1 - w).add_(w * x.mean(0))
            std.mul_(1 - w).add_(w * _unit(x.std(0, unbiased=False)))

    def _errors(self, b: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-row squared errors in standard deviations [B, D + 1] and termination logits and targets."""
        delta, reward, logit = self.net(b["obs"], b["action"])
        t_delta, t_reward, t_term = self._targets(b)
        n = self.net
        sq = torch.cat([((delta - (t_delta - n.delta_mean) / _unit(n.delta_std)) ** 2),
                        ((reward - (t_reward - n.reward_mean) / _unit(n.reward_std)) ** 2).unsqueeze(1)], dim=1)
        return sq, logit, t_term

    def learn(self, batch: Mapping[str, np.ndarray], keys: np.ndarray) -> dict[str, float]:
        """One update on the training rows of ``batch``; the held-out rows update the validation error."""
        held = holdout_mask(keys, self.cfg.holdout)
        b = {k: to_device(np.asarray(batch[k]), self.device) for k in ("obs", "action", "reward", "next_obs",
                                                                       "discount")}
        b = {k: v.float() if k != "action" or not self.net.discrete else v for k, v in b.items()}
        mask = torch.as_tensor(held, device=self.device)
        train = {k: v[~mask] for k, v in b.items()}
        figures: dict[str, float] = {}
        if len(train["obs"]):
            self._update_moments(train)
            sq, logit, term = self._errors(train)
            loss = sq.mean() + F.binary_cross_entropy_with_logits(logit, term)
            self.opt.step(torch.autograd.grad(loss, self.opt.params, allow_unused=True))
            self.num_updates += 1
            figures["loss"] = float(loss.detach())
        if mask.any():
            with torch.no_grad():
                val = {k: v[mask] for k, v in b.items()}
                sq, logit, term = self._errors(val)
                err = float(sq.mean()) + float(((logit > 0).float() != term).float().mean())
            rows = int(mask.sum())
            self.val_seen += rows
            if self.val_seen < MIN_VALIDATION:
                self.val_error = float("inf")
            elif self.val_error == float("inf"):
                self.val_error = err
            else:
                self.val_error += VAL_EMA * (err - self.val_error)
        figures["val_error"] = self.val_error
        return figures

    def weights(self) -> dict[str, np.ndarray]:
        arrays = publish_arrays(self.net)
        arrays[VAL_ERROR] = np.asarray(self.val_error, np.float32)
        return arrays

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Start from a published world model (:meth:`weights`: the net with its normalisation moments, and
        the validation error it was published with); ValueError, nothing changed, for another network's.
        The optimizer's moments stay as they are (a fresh modeler's: as initialised)."""
        load_arrays(self.net, {key: value for key, value in weights.items() if key != VAL_ERROR})
        if VAL_ERROR in weights:
            self.val_error = float(np.asarray(weights[VAL_ERROR]))
        self._moments = True  # the published net carries the moments it was trained with

    def state(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "opt": self.opt.state_dict(), "num_updates": self.num_updates,
                "val_error": self.val_error, "val_seen": self.val_seen, "moments": self._moments}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])
        self.num_updates = int(state["num_updates"])
        self.val_error = float(state["val_error"])
        self.val_seen = int(state["val_seen"])
        self._moments = bool(state["moments"])
