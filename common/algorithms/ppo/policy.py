"""PPO acting, in numpy: a Categorical over logits or a diagonal Gaussian with a state-independent
log-std, the log-prob of the sampled action and the critic's value as extras.

Continuous actions: the Gaussian sample is kept unclipped in ``extras["raw_action"]`` (its
log-prob is ``logp``; the adder stores it as the action), and the action returned for the env
is that sample clipped to the action space's bounds. ``deterministic=True`` (evaluators) is
the argmax / the Gaussian mean, clipped the same way.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch

from rlfleet.common.algorithms.acting import PolicyBase
from rlfleet.common.algorithms.contract import Columns
from rlfleet.common.algorithms.device import from_numpy
from rlfleet.common.algorithms.mlp import numpy_layers, numpy_mlp
from rlfleet.common.algorithms.ppo.networks import LOG_2PI, PPOCnnNetworks, normalize, seeded_networks
from rlfleet.common.algorithms.weights import check_arrays, load_arrays

NORM_KEYS = ("obs_norm.mean", "obs_norm.var", "obs_norm.count")


class PPOPolicy(PolicyBase):
    """``seed`` initialises the networks (the learner's seed); ``act_seed`` seeds the sampling rng."""

    def setup(self, observation_space: gym.Space, action_space: gym.Space, seed: int) -> None:
        cfg = self.cfg
        net = seeded_networks(cfg, observation_space, action_space, seed)
        self.discrete = net.discrete
        # images act through the CNN in torch; MLPs in numpy (a fifth of torch's cost per call)
        self._cnn: PPOCnnNetworks | None = net.eval() if isinstance(net, PPOCnnNetworks) else None
        arrays = net.arrays()
        self._shapes = {key: value.shape for key, value in arrays.items()}  # what load_weights accepts
        if not self.discrete:
            assert isinstance(action_space, gym.spaces.Box)
            self.low = action_space.low.reshape(-1).astype(np.float32)
            self.high = action_space.high.reshape(-1).astype(np.float32)
            self.action_shape = tuple(action_space.shape or ())
        assert observation_space.shape is not None
        shape = tuple(observation_space.shape)
        self.obs_mean, self.obs_var = np.zeros(shape, np.float32), np.ones(shape, np.float32)
        self._use(arrays)

    def _use(self, arrays: Mapping[str, np.ndarray]) -> None:
        if self._cnn is not None:
            load_arrays(self._cnn, arrays)
            self._log_std = None if self.discrete else np.array(arrays["log_std"], np.float64)
            return
        self._actor = numpy_layers(arrays, "actor")
        self._critic = numpy_layers(arrays, "critic")
        self._log_std = None if self.discrete else np.array(arrays["log_std"], np.float64)

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """The networks' arrays (checked as DQN's) and, with obs_norm, the normalisation statistics."""
        norm = {key: weights[key] for key in NORM_KEYS if key in weights}
        if self.cfg.obs_norm:
            missing = [key for key in NORM_KEYS if key not in norm]
            if missing:
                raise ValueError(f"weights do not fit the policy: missing {missing} (obs_norm is on)")
            for key in ("obs_norm.mean", "obs_norm.var"):
                if np.shape(norm[key]) != self.obs_mean.shape:
                    raise ValueError(f"weights {key!r} have shape {np.shape(norm[key])}; need {self.obs_mean.shape}")
        elif norm:
            raise ValueError(f"weights do not fit the policy: unexpected {sorted(norm)} (obs_norm is off)")
        arrays = {key: value for key, value in weights.items() if key not in NORM_KEYS}
        check_arrays(self._shapes, arrays)
        if norm:
            self.obs_mean = np.array(norm["obs_norm.mean"], np.float32)
            self.obs_var = np.array(norm["obs_norm.var"], np.float32)
        self._use(arrays)

    def _forward(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(actor output float64 [B, ...], value float32 [B])."""
        if self._cnn is not None:
            with torch.inference_mode():
                out, value = self._cnn.heads(from_numpy(np.asarray(obs)))
            return out.numpy().astype(np.float64), value.numpy().astype(np.float32)
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        if self.cfg.obs_norm:
            x = normalize(x, self.obs_mean.reshape(-1), self.obs_var.reshape(-1), self.cfg.obs_clip)
        return (numpy_mlp(self._actor, x, self.cfg.activation).astype(np.float64),
                numpy_mlp(self._critic, x, self.cfg.activation)[:, 0].astype(np.float32))

    def act(self, obs: np.ndarray, *, deterministic: bool = False) -> tuple[np.ndarray, Columns]:
        out, value = self._forward(obs)
        n = len(out)
        rows = np.arange(n)
        if self.discrete:
            logp_all = out - out.max(axis=1, keepdims=True)
            logp_all -= np.log(np.exp(logp_all).sum(axis=1, keepdims=True))
            if deterministic:
                actions = out.argmax(axis=1)
            else:  # inverse CDF on the policy's own rng: one uniform per row
                cdf = np.cumsum(np.exp(logp_all), axis=1)
                u = self.rng.random(n)[:, None] * cdf[:, -1:]
                actions = np.minimum((u > cdf).sum(axis=1), out.shape[1] - 1)
            actions = actions.astype(np.int64)
            return actions, {"logp": logp_all[rows, actions].astype(np.float32), "value": value}
        assert self._log_std is not None
        std = np.exp(self._log_std)
        noise = np.zeros_like(out) if deterministic else self.rng.standard_normal(out.shape)
        raw = out + std * noise
        logp = (-0.5 * noise**2 - self._log_std - 0.5 * LOG_2PI).sum(axis=1)
        raw32 = raw.astype(np.float32)
        env_action = np.clip(raw32, self.low, self.high).reshape(n, *self.action_shape)
        return env_action, {"logp": logp.astype(np.float32), "value": value,
                            "raw_action": raw32.reshape(n, *self.action_shape)}

