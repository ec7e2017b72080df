"""The SAC learner: critics, actor and temperature from one sampled batch of (n-step) transitions.

One update, as SB3's and CleanRL's SAC, with every gradient taken from the same parameters
(so compute and apply split cleanly for data-parallel learners and gradient workers):

    y        = r + discount * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s')),  a' ~ pi(.|s')
    critics  = 0.5 * (E[(Q1(s,a) - y)^2] + E[(Q2(s,a) - y)^2])   (importance-weighted when prioritized)
    actor    = E[alpha * log pi(a~|s) - min(Q1, Q2)(s, a~)],      a~ ~ pi(.|s), reparameterised
    alpha    = E[-log_alpha * (log pi(a~|s) + target_entropy)]    ('auto' only)

then the target critics follow by Polyak (tau). SB3 steps the temperature, then the critics,
then the actor against the critics just stepped; here all three come from the parameters
before the update. One actor pass covers s and s'; the actor loss goes through the critics with
their parameters detached, so one backward pass gives every gradient; both critics are one
batched matmul per layer (TwinMLP). Figures and priorities leave the device once, at the end
of compute_gradients.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from rlfleet.common.algorithms.actions import ActionScale, dims
from rlfleet.common.algorithms.contract import DataSpec, Grads
from rlfleet.common.algorithms.device import ArrayLike, cpu_copy, use_bfloat16
from rlfleet.common.algorithms.generators import generator_state, restore_generator
from rlfleet.common.algorithms.learning import LearnerBase
from rlfleet.common.algorithms.sac.config import SACConfig
from rlfleet.common.algorithms.sac.networks import seeded_networks, squashed_sample
from rlfleet.common.algorithms.schedules import linear
from rlfleet.common.algorithms.weights import load_arrays, publish_arrays, unprefixed

if TYPE_CHECKING:
    from rlfleet.common.algorithms.data_parallel import GradientAverager

COLUMNS = ("obs", "action", "reward", "next_obs", "discount")
PRIORITY_EPS = 1e-6
FIGURES = ("critic_loss", "actor_loss", "alpha", "entropy", "q_mean")


class SACLearner(LearnerBase):
    """Actor, twin critics and their targets, three Adams, the temperature. No sockets."""

    algorithm = "sac"
    checkpoint_format = 2  # 2: the learner base's layout; the generator's state tagged with its device (generators.py)

    def __init__(self, cfg: SACConfig, observation_space: gym.Space, action_space: gym.Space, *,
                 device: str | torch.device = "auto", seed: int = 0, averager: GradientAverager | None = None) -> None:
        assert isinstance(action_space, gym.spaces.Box)
        super().__init__(cfg, DataSpec(table_kinds=SACConfig.table_kinds, batch_items=cfg.batch_size,
                                       returns_priorities=True), device, averager, max_grad_norm=cfg.grad_clip)
        self.nets = seeded_networks(cfg, observation_space, action_space, seed).to(self.device)
        self.scale = ActionScale(action_space)
        self.act_dim = dims(observation_space, action_space)[1]
        self.target_entropy = float(-self.act_dim if cfg.target_entropy == "auto" else cfg.target_entropy)
        self.auto_alpha = cfg.ent_coef == "auto"
        start = cfg.ent_coef_init if cfg.ent_coef == "auto" else float(cfg.ent_coef)
        self.log_alpha = torch.tensor(math.log(start), device=self.device, requires_grad=self.auto_alpha)
        self._actor: list[torch.Tensor] = list(self.nets.actor.parameters())
        self._critic: list[torch.Tensor] = list(self.nets.critic.parameters())
        self._target: list[torch.Tensor] = list(self.nets.critic_target.parameters())
        self.add_optimizer("critic", self._critic, cfg.lr)
        self.add_optimizer("actor", self._actor, cfg.lr)
        if self.auto_alpha:
            self.add_optimizer("alpha", [self.log_alpha], cfg.lr)
        self.gen = torch.Generator(device=self.device).manual_seed(seed + 1)  # the actor's samples
        self.bf16 = use_bfloat16(cfg.update_dtype, self.device)

    def importance_exponent(self) -> float:
        """Linear from ``beta_start`` to 1 over ``beta_updates`` updates (a uniform table's equal
        probabilities weigh 1 whatever it is)."""
        return linear(self.cfg.beta_start, 1.0, self.num_updates, self.cfg.beta_updates)

    def _sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """a ~ pi(. | obs) in [-1, 1] and its log-prob, from the learner's own generator."""
        mean, log_std = self.nets.mean_log_std(obs)
        return squashed_sample(mean, log_std, torch.randn(mean.shape, generator=self.gen, device=self.device))

    def compute_gradients(
        self, batch: Mapping[str, ArrayLike], weights: ArrayLike | None = None
    ) -> tuple[Grads, dict[str, float], np.ndarray]:
        """Gradients {"critic", "actor", "alpha" (auto only)}, the step's figures, new priorities
        (mean |TD error| of the two critics)."""
        b = self.staging.columns(batch, COLUMNS, "SAC", weights)
        obs, next_obs = b["obs"].float().flatten(1), b["next_obs"].float().flatten(1)
        action = self.scale.to_unit(b["action"].float())
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self._gradients(obs, next_obs, action, b)

    def _gradients(self, obs: torch.Tensor, next_obs: torch.Tensor, action: torch.Tensor,
                   b: Mapping[str, torch.Tensor]) -> tuple[Grads, dict[str, float], np.ndarray]:
        n = len(obs)
        alpha = self.log_alpha.detach().exp()
        sampled, logp = self._sample(torch.cat([obs, next_obs]))
        a_pi, logp_pi = sampled[:n], logp[:n]
        with torch.no_grad():
            q1_next, q2_next = self.nets.q(self.nets.critic_target, next_obs, sampled[n:])
            soft_next = torch.min(q1_next, q2_next) - alpha * logp[n:]
            target = b["reward"].float() + b["discount"].float() * soft_next
        q1, q2 = self.nets.q(self.nets.critic, obs, action)
        td1, td2 = q1 - target, q2 - target
        squared = td1.pow(2) + td2.pow(2)
        if "weights" in b:
            squared = squared * b["weights"].float()
        critic_loss = 0.5 * squared.mean()
        q1_pi, q2_pi = self.nets.q(self.nets.critic, obs, a_pi, detached=True)  # trains the actor only
        actor_loss = (alpha * logp_pi - torch.min(q1_pi, q2_pi)).mean()
        # one backward pass: the critic loss reaches only the critics, the actor loss only the actor
        both = torch.autograd.grad(critic_loss + actor_loss, self._critic + self._actor)
        grads: Grads = {"critic": list(both[:len(self._critic)]), "actor": list(both[len(self._critic):])}
        with torch.no_grad():
            entropy = -logp_pi.detach().mean()
            if self.auto_alpha:  # d/dlog_alpha of -log_alpha * (log pi + target_entropy)
                grads["alpha"] = [(entropy - self.target_entropy).reshape(self.log_alpha.shape)]
            priorities = 0.5 * (td1.abs() + td2.abs()) + PRIORITY_EPS
            figures, host_priorities = self.staging.to_host(
                torch.stack([critic_loss, actor_loss, alpha, entropy, q1.mean()]), priorities)
        return grads, dict(zip(FIGURES, figures, strict=True)), host_priorities

    def after_update(self, stepped: Collection[str]) -> None:
        """The target critics follow (Polyak tau)."""
        with torch.no_grad():
            torch._foreach_lerp_(self._target, self._critic, self.cfg.tau)

    def weights(self) -> dict[str, np.ndarray]:
        """Only the actor: what acting needs (``actor.{0,2,..}.weight``/``.bias``)."""
        return publish_arrays(self.nets.actor, "actor.")

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Only the actor is published: it takes them; the critics, their targets and alpha stay."""
        load_arrays(self.nets.actor, unprefixed(weights, "actor."))

    def own_state(self) -> dict[str, Any]:
        return {"nets": cpu_copy(self.nets.state_dict()), "log_alpha": float(self.log_alpha.detach()),
                **generator_state(self.gen)}

    def load_own_state(self, state: Mapping[str, Any]) -> None:
        self.nets.load_state_dict(state["nets"])
        with torch.no_grad():
            self.log_alpha.fill_(float(state["log_alpha"]))
        restore_generator(self.gen, state)  # another device's state: re-seeded from it
