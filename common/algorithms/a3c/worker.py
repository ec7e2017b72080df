"""A3C's gradient worker: the n-step advantage actor-critic loss on its own rollouts.

Per rollout of ``n_steps`` steps of every env slot (the segments of
common/algorithms/adders/segments.py): values and the policy's log-probs from the
weights the worker acted with, advantages by GAE (lambda 1.0: the n-step returns
of A3C) bootstrapped from V of the observation after the rollout (of the final
observation at a time limit; nothing after a termination), then

    loss = -mean(logp(a) * A) - ent_coef * mean(entropy) + vf_coef * mean((R - V)^2)

Its gradient, clipped to ``max_grad_norm`` on the worker, goes to the
paramserver's shards, named like the parameters, which apply it with their own
optimizer (services/paramserver/gradients.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch

from rlfleet.common.algorithms.a3c.config import A3CConfig
from rlfleet.common.algorithms.a3c.policy import A3CPolicy
from rlfleet.common.algorithms.contract import SeedLike
from rlfleet.common.algorithms.ppo.losses import gae
from rlfleet.common.algorithms.weights import load_arrays, publish_arrays


class A3CWorker(A3CPolicy):
    """Acts (numpy) and computes gradients (torch) with the same weights version."""

    def __init__(self, cfg: A3CConfig, observation_space: gym.Space, action_space: gym.Space, *,
                 seed: int = 0, act_seed: SeedLike = None) -> None:
        super().__init__(cfg, observation_space, action_space, seed=seed, act_seed=act_seed)
        self.params = dict(self.net.named_parameters())

    def weights(self) -> dict[str, np.ndarray]:
        """The whole model as held now (from the experiment seed until weights are loaded)."""
        return publish_arrays(self.net)

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        super().load_weights(weights)
        load_arrays(self.net, weights)

    def gradients(self, items: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Named float32 gradients of the loss on ``items`` (segments [S, T]) and its figures."""
        cfg = self.cfg
        obs = torch.as_tensor(items["obs"])
        S, T = obs.shape[:2]
        flat = obs.reshape(S * T, *obs.shape[2:])
        logits, values = self.net(flat)
        with torch.no_grad():
            after = torch.cat([obs[:, 1:], torch.as_tensor(items["bootstrap_obs"]).unsqueeze(1)], dim=1)
            truncated = np.asarray(items["truncated"], bool)
            final = torch.as_tensor(items["final_obs"])
            after = torch.where(torch.as_tensor(truncated).reshape(S, T, *[1] * (obs.dim() - 2)), final, after)
            _, next_values = self.net(after.reshape(S * T, *obs.shape[2:]))
        terminated = np.asarray(items["terminated"], bool)
        advantages, returns = gae(items["reward"], values.detach().numpy().reshape(S, T),
                                  next_values.numpy().reshape(S, T), terminated, terminated | truncated,
                                  cfg.gamma, cfg.gae_lambda)
        adv = torch.as_tensor(advantages.reshape(-1), dtype=torch.float32)
        if cfg.normalize_advantage and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        ret = torch.as_tensor(returns.reshape(-1), dtype=torch.float32)
        logp_all = torch.log_softmax(logits, dim=1)
        action = torch.as_tensor(items["action"]).reshape(-1, 1).long()
        logp = logp_all.gather(1, action).squeeze(1)
        entropy = -(logp_all.exp() * logp_all).sum(dim=1).mean()
        policy_loss = -(logp * adv).mean()
        value_loss = (ret - values).pow(2).mean()
        loss = policy_loss - cfg.ent_coef * entropy + cfg.vf_coef * value_loss
        self.net.zero_grad(set_to_none=False)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(),
                                              cfg.max_grad_norm if cfg.max_grad_norm else float("inf"))
        grads = {name: np.ascontiguousarray(p.grad.numpy(), np.float32) if p.grad is not None
                 else np.zeros(tuple(p.shape), np.float32) for name, p in self.params.items()}
        figures = {name: float(value.detach()) for name, value in (
            ("loss", loss), ("policy_loss", policy_loss), ("value_loss", value_loss), ("entropy", entropy),
            ("grad_norm", norm))}
        return grads, figures
