"""The learner base: what every algorithm's learner shares, written once.

An algorithm's learner subclasses :class:`LearnerBase` and writes its networks, its loss
(:meth:`LearnerBase.compute_gradients`: batch -> gradients, figures, priorities) and, where it has
them, what follows a step (target networks: :meth:`LearnerBase.after_update`), its learning-rate
schedule (:meth:`LearnerBase.lr`), prioritized replay's importance weights
(:meth:`LearnerBase.weigh`) and the state of its own beyond networks and optimizers. The base
owns the rest:

- named optimizers (:meth:`add_optimizer`, one :class:`~rlfleet.common.algorithms.optim.ClippedAdam` each),
  stepped by :meth:`apply_gradients` with the global-norm clip and the learning rate now;
- data-parallel learning: a :class:`~rlfleet.common.algorithms.data_parallel.GradientAverager` handed to the
  constructor (``averager``; None: one learner) averages gradients between compute and apply
  (:meth:`average`) and sums cross-rank statistics (:meth:`group_sum`); :attr:`world` is the
  group's size;
- batches on the device: :attr:`staging` (:class:`~rlfleet.common.algorithms.device.HostStaging`: reused
  pinned buffers and non-blocking copies on CUDA, the arrays' own memory on CPU);
- the update counter, and checkpoints: :meth:`state` / :meth:`load_state` write and check the
  algorithm's name and checkpoint format version, the counter and every optimizer's state around
  the algorithm's own (:meth:`own_state` / :meth:`load_own_state`).

``learn`` is compute -> average -> apply; an algorithm whose learn call takes many steps (PPO's
epochs of minibatches) writes its own from the same three parts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from rlfleet.common.algorithms.contract import DataSpec, Grads
from rlfleet.common.algorithms.device import HostStaging, cpu_copy, resolve_device
from rlfleet.common.algorithms.importance import importance_weights
from rlfleet.common.algorithms.optim import ClippedAdam

if TYPE_CHECKING:
    from rlfleet.common.algorithms.data_parallel import GradientAverager


class LearnerBase:
    """Optimizers, clipping, data-parallel averaging, counters and checkpoints of a learner. No sockets."""

    algorithm: ClassVar[str]  # the registry name, written into checkpoints
    checkpoint_format: ClassVar[int]  # bumped when the checkpoint's layout changes

    def __init__(self, cfg: Any, data: DataSpec, device: str | torch.device = "auto",
                 averager: GradientAverager | None = None, max_grad_norm: float | None = None) -> None:
        self.cfg = cfg
        self.data = data
        self.device = resolve_device(device)
        self.staging = HostStaging(self.device)  # batches reach a CUDA device through reused pinned buffers
        self.averager = averager
        self.max_grad_norm = max_grad_norm
        self.optimizers: dict[str, ClippedAdam] = {}
        self.num_updates = 0

    # -- optimizers and the update ------------------------------------------------
    def add_optimizer(self, name: str, params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8) -> ClippedAdam:
        """An Adam over ``params``, stepped by :meth:`apply_gradients` with ``grads[name]``."""
        self.optimizers[name] = ClippedAdam(params, lr=lr, eps=eps)
        return self.optimizers[name]

    @property
    def world(self) -> int:
        """Learners in this learner's data-parallel group (1 without one)."""
        return 1 if self.averager is None else self.averager.world

    def compute_gradients(self, batch: Mapping[str, Any], weights: Any = None
                          ) -> tuple[Grads, dict[str, float], np.ndarray | None]:
        """The algorithm's loss on ``batch``: its gradients by optimizer name, figures, priorities or None."""
        raise NotImplementedError

    def average(self, grads: Grads) -> Grads:
        """The mean of ``grads`` over the data-parallel group (as they are with one learner)."""
        return grads if self.averager is None else self.averager.average(grads)

    def group_sum(self, tensors: list[torch.Tensor]) -> None:
        """Sum each of ``tensors`` over the group, in place (statistics every rank must agree on)."""
        if self.averager is not None:
            self.averager.sum(tensors)

    def apply_gradients(self, grads: Grads) -> None:
        """One step of every optimizer ``grads`` names (clipped to ``max_grad_norm``, at :meth:`lr`): an
        algorithm that steps a network only on some updates (TD3's delayed actor) leaves its gradients
        out on the others; then :meth:`after_update` with the names stepped."""
        for name, optimizer in self.optimizers.items():
            if name in grads:
                optimizer.step(grads[name], self.max_grad_norm, self.lr(name))
        self.num_updates += 1
        self.after_update(grads.keys())

    def learn(self, batch: Mapping[str, Any], weights: Any = None) -> tuple[dict[str, float], np.ndarray | None]:
        """One update on one sampled batch: compute, average over the group, apply."""
        grads, figures, priorities = self.compute_gradients(batch, weights)
        self.apply_gradients(self.average(grads))
        return figures, priorities

    def lr(self, optimizer: str) -> float | None:
        """The learning rate of ``optimizer`` now; None: the one it was made with."""
        return None

    def after_update(self, stepped: Collection[str]) -> None:
        """What follows every step (target networks); ``stepped``: the optimizers that stepped."""

    def importance_exponent(self) -> float | None:
        """Prioritized replay's importance-sampling exponent now; None: the algorithm learns unweighted."""
        return None

    def weigh(self, probability: np.ndarray) -> np.ndarray | None:
        """Importance weights for a batch sampled with these probabilities (replay's ``probability``
        column), with :meth:`importance_exponent` now; None: learn unweighted."""
        exponent = self.importance_exponent()
        return None if exponent is None else importance_weights(probability, exponent)

    # -- published weights and checkpoints -----------------------------------------
    def weights(self) -> dict[str, np.ndarray]:
        """CPU float32 copies of what acting needs, as named arrays, to publish."""
        raise NotImplementedError

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Start from published weights (the inverse of :meth:`weights`); networks that are not
        published, optimizer moments and counters stay as they are. ValueError, with nothing
        copied, for weights of another network."""
        raise NotImplementedError

    def resume_env_steps(self, env_steps: int) -> None:
        """The fleet's env steps so far (a learner with no checkpoint): what runs on env steps goes on from
        there. Nothing here: the base's schedules run on updates, which the fleet does not count."""

    def state(self) -> dict[str, Any]:
        """A checkpoint of plain tensors, dicts, lists and numbers (loads with weights_only=True).

        Tensors are CPU copies, so the checkpoint can be written while training goes on."""
        return {"algorithm": self.algorithm, "format": self.checkpoint_format, "num_updates": self.num_updates,
                "optimizers": {name: cpu_copy(opt.state_dict()) for name, opt in self.optimizers.items()},
                **self.own_state()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("algorithm") != self.algorithm or state.get("format") != self.checkpoint_format:
            raise ValueError(f"not a {self.algorithm.upper()} checkpoint of format {self.checkpoint_format}: algorithm="
                             f"{state.get('algorithm')!r}, format={state.get('format')!r}")
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        self.num_updates = int(state["num_updates"])
        self.load_own_state(state)

    def own_state(self) -> dict[str, Any]:
        """The algorithm's part of the checkpoint: networks, statistics, generators."""
        return {}

    def load_own_state(self, state: Mapping[str, Any]) -> None: ...
