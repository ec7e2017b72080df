"""The TD3 learner: twin critics every update; the actor and the Polyak targets every
``policy_delay``-th update (Fujimoto et al. 2018; as SB3's and CleanRL's TD3).

    a'      = clip(actor'(s') + clip(policy_noise * N(0, 1), -noise_clip, noise_clip), -1, 1)
    y       = r + discount * min(Q1', Q2')(s', a')                    (clipped double Q)
    critics = E[(Q1(s,a) - y)^2] + E[(Q2(s,a) - y)^2]                 (importance-weighted when prioritized)
    actor   = -E[Q1(s, actor(s))]                                     (delayed updates only)

Actions are in [-1, 1] inside the networks, so the noises are in units of half the action range.
On update k (counting from 1) the critics always step; when k is a multiple of ``policy_delay``
the actor steps too and then the target actor and critics follow by Polyak (tau). Every gradient
of an update is taken from the parameters before it (CleanRL steps the actor against the critics
it has just stepped), so compute and apply split cleanly for data-parallel learners: the actor's
gradient is computed only on the delayed updates, in the same backward pass as the critics', the
actor loss going through the critics with their parameters detached.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from rlfleet.common.algorithms.actions import ActionScale
from rlfleet.common.algorithms.contract import DataSpec, Grads
from rlfleet.common.algorithms.device import ArrayLike, cpu_copy
from rlfleet.common.algorithms.generators import generator_state, restore_generator
from rlfleet.common.algorithms.learning import LearnerBase
from rlfleet.common.algorithms.schedules import linear
from rlfleet.common.algorithms.td3.config import TD3Config
from rlfleet.common.algorithms.td3.networks import seeded_networks
from rlfleet.common.algorithms.weights import load_arrays, publish_arrays, unprefixed

if TYPE_CHECKING:
    from rlfleet.common.algorithms.data_parallel import GradientAverager

COLUMNS = ("obs", "action", "reward", "next_obs", "discount")
PRIORITY_EPS = 1e-6


class TD3Learner(LearnerBase):
    """Actor, twin critics and a target of each, two Adams. No sockets."""

    algorithm = "td3"
    checkpoint_format = 1

    def __init__(self, cfg: TD3Config, observation_space: gym.Space, action_space: gym.Space, *,
                 device: str | torch.device = "auto", seed: int = 0, averager: GradientAverager | None = None) -> None:
        assert isinstance(action_space, gym.spaces.Box)
        super().__init__(cfg, DataSpec(table_kinds=TD3Config.table_kinds, batch_items=cfg.batch_size,
                                       returns_priorities=True), device, averager, max_grad_norm=cfg.grad_clip)
        self.nets = seeded_networks(cfg, observation_space, action_space, seed).to(self.device)
        self.scale = ActionScale(action_space)
        self._actor: list[torch.Tensor] = list(self.nets.actor.parameters())
        self._critic: list[torch.Tensor] = list(self.nets.critic.parameters())
        # the targets and what they follow, in one list each (one Polyak lerp for all)
        self._targets: list[torch.Tensor] = [*self.nets.actor_target.parameters(),
                                             *self.nets.critic_target.parameters()]
        self._sources: list[torch.Tensor] = [*self._actor, *self._critic]
        self.add_optimizer("critic", self._critic, cfg.lr)
        self.add_optimizer("actor", self._actor, cfg.lr)
        self.gen = torch.Generator(device=self.device).manual_seed(seed + 1)  # target policy smoothing noise

    def importance_exponent(self) -> float:
        """Linear from ``beta_start`` to 1 over ``beta_updates`` updates (a uniform table's equal
        probabilities weigh 1 whatever it is)."""
        return linear(self.cfg.beta_start, 1.0, self.num_updates, self.cfg.beta_updates)

    def policy_update_due(self) -> bool:
        """Whether the next update steps the actor and the targets (every ``policy_delay``-th)."""
        return (self.num_updates + 1) % self.cfg.policy_delay == 0

    def smoothed_target_action(self, next_obs: torch.Tensor) -> torch.Tensor:
        """The target actor's action in [-1, 1] plus clipped Gaussian noise, clipped to [-1, 1]
        (target policy smoothing), the noise from the learner's own generator."""
        action = self.nets.act(self.nets.actor_target, next_obs)
        noise = torch.randn(action.shape, generator=self.gen, device=self.device) * self.cfg.policy_noise
        return (action + noise.clamp(-self.cfg.noise_clip, self.cfg.noise_clip)).clamp(-1.0, 1.0)

    def compute_gradients(
        self, batch: Mapping[str, ArrayLike], weights: ArrayLike | None = None
    ) -> tuple[Grads, dict[str, float], np.ndarray]:
        """Gradients {"critic"} and, on a delayed update, {"actor"}; the step's figures; new priorities
        (mean |TD error| of the two critics)."""
        b = self.staging.columns(batch, COLUMNS, "TD3", weights)
        obs, next_obs = b["obs"].float().flatten(1), b["next_obs"].float().flatten(1)
        action = self.scale.to_unit(b["action"].float())
        nets = self.nets
        with torch.no_grad():
            q1_next, q2_next = nets.q(nets.critic_target, next_obs, self.smoothed_target_action(next_obs))
            target = b["reward"].float() + b["discount"].float() * torch.min(q1_next, q2_next)
        q1, q2 = nets.q(nets.critic, obs, action)
        td1, td2 = q1 - target, q2 - target
        squared = td1.pow(2) + td2.pow(2)
        if weights is not None:
            squared = squared * b["weights"].float()
        critic_loss = squared.mean()
        figures = {"critic_loss": critic_loss.detach(), "q_mean": q1.detach().mean()}
        if self.policy_update_due():
            q1_pi, _ = nets.q(nets.critic, obs, nets.act(nets.actor, obs), detached=True)  # trains the actor only
            actor_loss = -q1_pi.mean()
            # one backward pass: the critic loss reaches only the critics, the actor loss only the actor
            both = torch.autograd.grad(critic_loss + actor_loss, self._critic + self._actor)
            grads: Grads = {"critic": list(both[:len(self._critic)]), "actor": list(both[len(self._critic):])}
            figures["actor_loss"] = actor_loss.detach()
        else:
            grads = {"critic": list(torch.autograd.grad(critic_loss, self._critic))}
        with torch.no_grad():
            priorities = 0.5 * (td1.abs() + td2.abs()) + PRIORITY_EPS
            values, host_priorities = self.staging.to_host(torch.stack(list(figures.values())), priorities)
        return grads, dict(zip(figures, values, strict=True)), host_priorities

    def after_update(self, stepped: Collection[str]) -> None:
        """The target actor and critics follow (Polyak tau), only after a delayed update: compute_gradients
        gives the actor's gradients (and so the base steps it) on those alone."""
        if "actor" not in stepped:
            return
        with torch.no_grad():
            torch._foreach_lerp_(self._targets, self._sources, self.cfg.tau)

    def weights(self) -> dict[str, np.ndarray]:
        """Only the actor: what acting needs (``actor.{0,2,..}.weight``/``.bias``)."""
        return publish_arrays(self.nets.actor, "actor.")

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Only the actor is published: it and its target take them; the critics and theirs stay."""
        load_arrays(self.nets.actor, unprefixed(weights, "actor."))
        self.nets.actor_target.load_state_dict(self.nets.actor.state_dict())

    def own_state(self) -> dict[str, Any]:
        return {"nets": cpu_copy(self.nets.state_dict()), **generator_state(self.gen)}

    def load_own_state(self, state: Mapping[str, Any]) -> None:
        self.nets.load_state_dict(state["nets"])
        restore_generator(self.gen, state)  # another device's state: re-seeded from it

