"""DQN acting: epsilon-greedy on the online network, the Ape-X epsilon of each actor and its
schedule over the fleet's env steps, and the initial priorities of what an actor inserts.

CPU, no gradients; up to NUMPY_ROWS rows act through numpy (a fifth of torch's per-call cost).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlfleet.common.algorithms.acting import PolicyBase
from rlfleet.common.algorithms.contract import Columns
from rlfleet.common.algorithms.device import to_device, use_bfloat16
from rlfleet.common.algorithms.dqn.config import DQNConfig
from rlfleet.common.algorithms.dqn.networks import n_step_target, numpy_q, seeded_q_network
from rlfleet.common.algorithms.schedules import linear
from rlfleet.common.algorithms.weights import load_arrays

NUMPY_ROWS = 64  # DQNPolicy.q_values: numpy up to this many rows, torch above
NO_EXTRAS: Columns = {}


def apex_epsilon(index: int, num_actors: int, eps: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X per-actor exploration: eps_i = eps^(1 + alpha * i / (N - 1)); one actor gets eps."""
    if not 0 <= index < num_actors:
        raise ValueError(f"actor index {index} outside [0, {num_actors})")
    if num_actors == 1:
        return eps
    return float(eps ** (1.0 + alpha * index / (num_actors - 1)))


def actor_epsilon(cfg: DQNConfig, index: int, num_actors: int, fleet_env_steps: int = 0) -> float:
    """The epsilon of actor ``index`` of ``num_actors`` when the fleet has taken ``fleet_env_steps``."""
    final = apex_epsilon(index, num_actors, cfg.epsilon, cfg.epsilon_alpha)
    # linear from epsilon_start at fleet step 0 to the actor's Ape-X value at epsilon_decay_steps (None: that value)
    return linear(cfg.epsilon_start, final, fleet_env_steps, cfg.epsilon_decay_steps)


def column(batch: Mapping[str, Any], key: str) -> Any:
    if key not in batch:
        raise KeyError(f"batch has no column {key!r}; DQN needs obs, action, reward, next_obs, discount")
    return batch[key]


class DQNPolicy(PolicyBase):
    """Epsilon-greedy acting on the online network.

    ``seed`` initialises the network (the learner's seed: actors start where it starts);
    ``act_seed`` seeds the policy's own rng (default: ``seed``). The epsilon is 0 (greedy)
    until :meth:`explore` sets it; ``act(deterministic=True)`` is always greedy.
    """

    def setup(self, observation_space: gym.Space, action_space: gym.Space, seed: int) -> None:
        cfg = self.cfg
        self.net = seeded_q_network(cfg, observation_space, action_space, seed).to(self.device).eval()
        self.num_actions = int(action_space.n)  # type: ignore[attr-defined]
        self.epsilon = 0.0
        # a CUDA policy and a CNN act in torch: no host copy to keep
        self._numpy = self.device.type == "cpu" and self.net.is_mlp
        self._layers = self.net.numpy_layers() if self._numpy else []
        self.bf16_priorities = use_bfloat16(cfg.priorities_dtype, self.device, auto=not self.net.is_mlp)

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Copy in published weights (state_dict names -> arrays); all checked before any is copied."""
        load_arrays(self.net, weights)
        if self._numpy:
            self._layers = self.net.numpy_layers()

    def explore(self, actor_index: int, num_actors: int, fleet_env_steps: int) -> dict[str, float]:
        """Set this actor's Ape-X epsilon on its schedule; returns {"epsilon": ...}."""
        self.epsilon = actor_epsilon(self.cfg, actor_index, num_actors, fleet_env_steps)
        return {"epsilon": self.epsilon}

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q(obs, .) as float32[B, num_actions].

        Up to NUMPY_ROWS rows (an actor's or an evaluation's vector env) in numpy, which costs
        far less per call than torch for a small MLP; more (a batch) in torch. The two agree
        to float32 rounding.
        """
        if self._numpy and len(obs) <= NUMPY_ROWS:
            return numpy_q(self._layers, obs)
        with torch.inference_mode():
            return self.net(to_device(np.asarray(obs), self.device)).cpu().numpy()  # type: ignore[no-any-return]

    def act(self, obs: np.ndarray, *, deterministic: bool = False) -> tuple[np.ndarray, Columns]:
        """int64[B] actions: uniform with probability epsilon, else greedy; no extras.

        The rng is drawn from the same amount every exploring call, so a run's random
        stream does not depend on which actions happened to be greedy.
        """
        actions = self.q_values(obs).argmax(axis=1).astype(np.int64)
        if deterministic:
            return actions, NO_EXTRAS
        explore = self.rng.random(len(obs)) < self.epsilon
        random_actions = self.rng.integers(self.num_actions, size=len(obs))
        actions[explore] = random_actions[explore]
        return actions, NO_EXTRAS

    def priorities(self, items: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """|n-step TD error| + priority_eps, float64[B], computed where the data is made.

        An actor has no target network, so the bootstrap uses its online net for
        both choosing and valuing a* (max_a Q(s', a)). Ape-X does the same; the
        learner overwrites these with proper double-Q errors once sampled. None with
        ``actor_priorities: false`` (the items enter at the table's highest priority). In bfloat16
        where ``priorities_dtype`` says so.
        """
        if not self.cfg.actor_priorities:
            return None
        obs = to_device(column(items, "obs"), self.device)
        next_obs = to_device(column(items, "next_obs"), self.device)
        action = to_device(column(items, "action"), self.device).long()
        reward = to_device(column(items, "reward"), self.device).float()
        discount = to_device(column(items, "discount"), self.device).float()
        with torch.inference_mode(), torch.autocast(self.device.type, torch.bfloat16, enabled=self.bf16_priorities):
            q_all = self.net(torch.cat([obs, next_obs])).float()
            q, next_q = q_all[: len(obs)], q_all[len(obs) :]
            q_sa = q.gather(1, action[:, None]).squeeze(1)
            target = n_step_target(reward, discount, next_q, next_q, double=False)
            priorities = (target - q_sa).abs() + self.cfg.priority_eps
        return priorities.double().cpu().numpy()  # type: ignore[no-any-return]
