"""HogWild DQN as services: each actor computes DQN gradients on its own buffer and pushes them.

Seed 001 ran DQN as threads updating one shared network under a lock; here each
gradient worker keeps the last ``hogwild_buffer`` n-step transitions it made,
and for every vector step that completes transitions (once it holds
``hogwild_start``) computes the learner's loss (:class:`~.learner.DQNLearner`'s
``compute_gradients``: double-Q n-step Huber targets from its local target
network) on a uniform batch of ``batch_size``, clips the gradient's global norm
to ``grad_clip`` and returns it, named like the published weights, for the
paramserver's shards to apply. The local target network follows the online
weights the worker pulled (Polyak ``tau``, or a hard copy every ``target_period``
gradients).
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch

from rlfleet.common.algorithms.contract import SeedLike
from rlfleet.common.algorithms.dqn.config import DQNConfig
from rlfleet.common.algorithms.dqn.learner import COLUMNS, DQNLearner
from rlfleet.common.algorithms.dqn.policy import DQNPolicy
from rlfleet.common.algorithms.weights import load_arrays


class LocalBuffer:
    """A ring of the last ``capacity`` n-step transitions (the columns the loss reads)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.columns: dict[str, np.ndarray] = {}
        self.size = 0
        self.next = 0

    def add(self, items: Mapping[str, np.ndarray]) -> None:
        n = len(items["obs"])
        if not self.columns:
            self.columns = {k: np.zeros((self.capacity, *np.shape(items[k])[1:]), np.asarray(items[k]).dtype)
                            for k in COLUMNS}
        idx = (self.next + np.arange(n)) % self.capacity
        for k, col in self.columns.items():
            col[idx] = items[k]
        self.next = int((self.next + n) % self.capacity)
        self.size = min(self.capacity, self.size + n)

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        idx = rng.integers(0, self.size, batch_size)
        return {k: col[idx] for k, col in self.columns.items()}


class DQNWorker(DQNPolicy):
    """Acts epsilon-greedily (the Ape-X schedule) and computes DQN gradients on its own buffer."""

    def __init__(self, cfg: DQNConfig, observation_space: gym.Space, action_space: gym.Space, *,
                 seed: int = 0, act_seed: SeedLike = None) -> None:
        super().__init__(cfg, observation_space, action_space, device="cpu", seed=seed, act_seed=act_seed)
        self.learner = DQNLearner(cfg, observation_space, action_space, device="cpu", seed=seed)
        self.names = [name for name, _ in self.learner.online.named_parameters()]
        self.buffer = LocalBuffer(cfg.hogwild_buffer)
        self.sample_rng = np.random.default_rng(self.rng.integers(1 << 62))

    def weights(self) -> dict[str, np.ndarray]:
        return self.learner.weights()

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        super().load_weights(weights)
        load_arrays(self.learner.online, weights)

    def gradients(self, items: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray] | None, dict[str, float]]:
        self.buffer.add(items)
        if self.buffer.size < max(self.cfg.hogwild_start, self.cfg.batch_size):
            return None, {}
        batch = self.buffer.sample(self.cfg.batch_size, self.sample_rng)
        grads, figures, _ = self.learner.compute_gradients(batch, None)
        g = grads["q"]
        if self.cfg.grad_clip is not None and figures["grad_norm"] > self.cfg.grad_clip:
            torch._foreach_mul_(g, self.cfg.grad_clip / (figures["grad_norm"] + 1e-6))
        self.learner.num_updates += 1
        self.learner.follow_target()  # the target follows the weights pulled last
        named = {name: np.ascontiguousarray(t.numpy(), np.float32) for name, t in zip(self.names, g, strict=True)}
        return named, figures
