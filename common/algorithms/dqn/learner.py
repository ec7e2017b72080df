"""The DQN learner: online and target networks, Adam, and the Ape-X update.

One update = :meth:`DQNLearner.compute_gradients` (the Huber loss of the n-step
double-Q target, importance-weighted, differentiated by autograd) then
:meth:`DQNLearner.apply_gradients` (norm clip, Adam step, target network).
Returns the new priorities, |TD error| + priority_eps, from the networks
before the step.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from rlfleet.common.algorithms.contract import DataSpec, Grads
from rlfleet.common.algorithms.device import ArrayLike, cpu_copy, use_bfloat16
from rlfleet.common.algorithms.dqn.config import DQNConfig
from rlfleet.common.algorithms.dqn.networks import n_step_target, seeded_q_network
from rlfleet.common.algorithms.dqn.policy import column
from rlfleet.common.algorithms.learning import LearnerBase
from rlfleet.common.algorithms.schedules import linear
from rlfleet.common.algorithms.weights import load_arrays, publish_arrays

if TYPE_CHECKING:
    from rlfleet.common.algorithms.data_parallel import GradientAverager

COLUMNS = ("obs", "action", "reward", "next_obs", "discount")


class DQNLearner(LearnerBase):
    """Online + target networks, Adam, and the Ape-X update. No sockets."""

    algorithm = "dqn"
    checkpoint_format = 2  # 2: the learner base's layout (optimizers by name)

    def __init__(self, cfg: DQNConfig, observation_space: gym.Space, action_space: gym.Space, *,
                 device: str | torch.device = "auto", seed: int = 0, averager: GradientAverager | None = None) -> None:
        super().__init__(cfg, DataSpec(table_kinds=DQNConfig.table_kinds, batch_items=cfg.batch_size,
                                       returns_priorities=True), device, averager, max_grad_norm=cfg.grad_clip)
        self.online = seeded_q_network(cfg, observation_space, action_space, seed).to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.add_optimizer("q", self.online.parameters(), cfg.lr, cfg.adam_eps)
        self._online_params: list[torch.Tensor] = list(self.online.parameters())
        self._target_params: list[torch.Tensor] = list(self.target.parameters())
        self.bf16 = use_bfloat16(cfg.update_dtype, self.device)

    def importance_exponent(self, updates: int | None = None) -> float:
        """Prioritized replay's importance-sampling exponent at ``updates`` (default: now): linear from
        ``beta_start`` to 1 over ``beta_updates`` updates."""
        n = self.num_updates if updates is None else updates
        return linear(self.cfg.beta_start, 1.0, n, self.cfg.beta_updates)

    def compute_gradients(
        self, batch: Mapping[str, ArrayLike], weights: ArrayLike | None = None
    ) -> tuple[Grads, dict[str, float], np.ndarray]:
        """Gradients of the (importance-weighted) Huber loss; the step's figures; new priorities.

        ``weights`` are the importance weights of prioritized replay (:meth:`weigh`, normalised by
        the batch's largest), used as given; None means uniform. Grads: {"q": one tensor per parameter}.
        """
        cfg = self.cfg
        b = self.staging.to_device({key: column(batch, key) for key in COLUMNS}
                                   | ({} if weights is None else {"weights": weights}))
        action = b["action"].long()[:, None]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            q_sa = self.online(b["obs"]).gather(1, action).squeeze(1)
            with torch.no_grad():  # Q-values come out float32 (the heads): the target is float32 too
                next_q_target = self.target(b["next_obs"])
                next_q_online = self.online(b["next_obs"]) if cfg.double else next_q_target
                target = n_step_target(b["reward"].float(), b["discount"].float(), next_q_online, next_q_target,
                                       cfg.double)
        losses = F.huber_loss(q_sa, target, reduction="none", delta=cfg.huber_delta)
        if weights is not None:
            losses = losses * b["weights"].float()
        loss = losses.mean()
        grads = list(torch.autograd.grad(loss, self._online_params))
        with torch.no_grad():
            td_abs = (target - q_sa).abs()
            grad_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
            # one device-to-host copy for the figures and the priorities
            figures, priorities = self.staging.to_host(torch.stack([loss, q_sa.mean(), td_abs.mean(), grad_norm]),
                                                       td_abs + cfg.priority_eps)
        return {"q": grads}, dict(zip(("loss", "q_mean", "td_abs_mean", "grad_norm"), figures, strict=True)), priorities

    def after_update(self, stepped: Collection[str]) -> None:
        self.follow_target()

    def follow_target(self) -> None:
        """The target network follows the online one: Polyak ``tau``, or a hard copy every ``target_period``."""
        with torch.no_grad():
            if self.cfg.target_update == "polyak":
                torch._foreach_lerp_(self._target_params, self._online_params, self.cfg.tau)
            elif self.num_updates % self.cfg.target_period == 0:
                self.target.load_state_dict(self.online.state_dict())

    def weights(self) -> dict[str, np.ndarray]:
        """CPU float32 copies of the online state_dict, to publish."""
        return publish_arrays(self.online)

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """The online network takes them and the target starts equal to it."""
        load_arrays(self.online, weights)
        self.target.load_state_dict(self.online.state_dict())

    def own_state(self) -> dict[str, Any]:
        return {"online": cpu_copy(self.online.state_dict()), "target": cpu_copy(self.target.state_dict())}

    def load_own_state(self, state: Mapping[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
