"""Ape-X DQN: double Q, dueling heads, n-step returns, prioritized replay.

Horgan et al. 2018, "Distributed Prioritized Experience Replay". Pure
algorithm code, no sockets:

- :class:`DQNPolicy` acts in the actors (epsilon-greedy, CPU) and computes the
  initial priorities of the transitions they insert.
- :class:`~common.algorithms.nstep.NStepBuilder` turns vector-env steps into
  n-step transitions (obs, action, reward, next_obs, discount).
- :class:`DQNLearner` holds the online and target networks and the optimizer
  and does one update per sampled batch, returning the new priorities.

A transition's ``discount`` already holds gamma^k (0 after a termination), so
the n-step target is simply ``reward + discount * Q_target(next_obs, a*)``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from common.algorithms import AlgorithmModule, EnvMismatch
from common.algorithms.device import (
    ArrayLike,
    batch_to_device,
    cpu_copy,
    resolve_device,
    to_device,
)
from common.algorithms.dqn_networks import QNetwork, build_q_network, numpy_q
from common.algorithms.nstep import NStepBuilder
from common.config import DQNConfig

COLUMNS = ("obs", "action", "reward", "next_obs", "discount")
NUMPY_ROWS = 64  # DQNPolicy.q_values: numpy up to this many rows, torch above
CHECKPOINT_FORMAT = 1


def apex_epsilon(index: int, num_actors: int, eps: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X per-actor exploration: eps_i = eps^(1 + alpha * i / (N - 1)); one actor gets eps."""
    if not 0 <= index < num_actors:
        raise ValueError(f"actor index {index} outside [0, {num_actors})")
    if num_actors == 1:
        return eps
    return float(eps ** (1.0 + alpha * index / (num_actors - 1)))


def scheduled_epsilon(final: float, fleet_env_steps: int, start: float, decay_steps: int | None) -> float:
    """Linear from ``start`` at fleet step 0 to ``final`` (the actor's Ape-X value) at ``decay_steps``.

    ``decay_steps`` None: ``final`` throughout (the constant per-actor epsilons of the paper).
    """
    if not decay_steps or fleet_env_steps >= decay_steps:
        return final
    return float(start + (final - start) * max(0, fleet_env_steps) / decay_steps)


def beta_schedule(updates: int, beta_start: float, beta_updates: int) -> float:
    """Importance-sampling exponent, linear from beta_start to 1 over beta_updates."""
    return float(min(1.0, beta_start + (1.0 - beta_start) * updates / beta_updates))


def n_step_target(
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_q_online: torch.Tensor,
    next_q_target: torch.Tensor,
    double: bool = True,
) -> torch.Tensor:
    """reward + discount * Q_target(s', a*), a* = argmax Q_online(s') (double) or argmax Q_target(s')."""
    if double:
        best = next_q_online.argmax(dim=1, keepdim=True)
        bootstrap = next_q_target.gather(1, best).squeeze(1)
    else:
        bootstrap = next_q_target.max(dim=1).values
    return reward + discount * bootstrap


def check_env(cfg: DQNConfig, observation_space: gym.Space, action_space: gym.Space, env_id: str | None = None) -> None:
    env = f"env {env_id}" if env_id else "the env"
    if not isinstance(action_space, gym.spaces.Discrete):
        raise EnvMismatch(f"algorithm {cfg.name} needs a Discrete action space; {env} has {action_space}")
    if int(action_space.start) != 0:
        raise EnvMismatch(f"algorithm {cfg.name} needs Discrete actions starting at 0; {env} has {action_space}")
    if not isinstance(observation_space, gym.spaces.Box):
        raise EnvMismatch(
            f"algorithm {cfg.name} needs a Box observation space (flattened into an MLP); {env} has {observation_space}"
        )


def _build(cfg: DQNConfig, observation_space: gym.Space, action_space: gym.Space, seed: int) -> QNetwork:
    check_env(cfg, observation_space, action_space)
    # Initialise from the seed without disturbing anyone else's torch RNG; the
    # learner and a policy built with the same seed start from the same weights.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_q_network(cfg.hidden, cfg.dueling, observation_space, action_space)


def _column(batch: Mapping[str, Any], key: str) -> Any:
    if key not in batch:
        raise KeyError(f"batch has no column {key!r}; DQN needs {', '.join(COLUMNS)}")
    return batch[key]


class DQNPolicy:
    """Epsilon-greedy acting on the online network; cheap, CPU, no gradients."""

    def __init__(
        self,
        cfg: DQNConfig,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> None:
        self.cfg = cfg
        self.device = resolve_device(device)
        self.net = _build(cfg, observation_space, action_space, seed).to(self.device).eval()
        self.num_actions = int(action_space.n)  # type: ignore[attr-defined]
        self._numpy = self.device.type == "cpu"  # a CUDA policy acts in torch: no host copy to keep
        self._layers = self.net.numpy_layers() if self._numpy else []

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Copy in published weights (state_dict names -> arrays); all checked before any is copied."""
        load_arrays(self.net, weights)
        if self._numpy:
            self._layers = self.net.numpy_layers()

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q(obs, .) as float32[B, num_actions].

        Up to NUMPY_ROWS rows (an actor's or an evaluation's vector env) in numpy, which costs
        far less per call than torch for a small MLP; more (a batch) in torch. The two agree
        to float32 rounding.
        """
        if self._numpy and len(obs) <= NUMPY_ROWS:
            return numpy_q(self._layers, obs)
        with torch.inference_mode():
            return self.net(to_device(obs, self.device)).cpu().numpy()  # type: ignore[no-any-return]

    def act(self, obs: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        """int64[B] actions: uniform with probability epsilon, else greedy.

        The rng is drawn from the same amount every call, so a run's random
        stream does not depend on which actions happened to be greedy.
        """
        explore = rng.random(len(obs)) < epsilon
        random_actions = rng.integers(self.num_actions, size=len(obs))
        actions = self.q_values(obs).argmax(axis=1).astype(np.int64)
        actions[explore] = random_actions[explore]
        return actions

    def initial_priorities(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """|n-step TD error| + priority_eps, float64[B], computed where the data is made.

        An actor has no target network, so the bootstrap uses its online net for
        both choosing and valuing a* (max_a Q(s', a)). Ape-X does the same; the
        learner overwrites these with proper double-Q errors once sampled.
        """
        obs = to_device(_column(columns, "obs"), self.device)
        next_obs = to_device(_column(columns, "next_obs"), self.device)
        action = to_device(_column(columns, "action"), self.device).long()
        reward = to_device(_column(columns, "reward"), self.device).float()
        discount = to_device(_column(columns, "discount"), self.device).float()
        with torch.inference_mode():
            q_all = self.net(torch.cat([obs, next_obs]))
            q, next_q = q_all[: len(obs)], q_all[len(obs) :]
            q_sa = q.gather(1, action[:, None]).squeeze(1)
            target = n_step_target(reward, discount, next_q, next_q, double=False)
            priorities = (target - q_sa).abs() + self.cfg.priority_eps
        return priorities.double().cpu().numpy()  # type: ignore[no-any-return]


class DQNLearner:
    """Online + target networks, Adam, and the Ape-X update. No sockets."""

    def __init__(
        self,
        cfg: DQNConfig,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        device: str | torch.device = "auto",
        seed: int = 0,
    ) -> None:
        self.cfg = cfg
        self.device = resolve_device(device)
        self.online = _build(cfg, observation_space, action_space, seed).to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        # fused: one kernel for every parameter instead of a dozen small ops each (CPU and CUDA)
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=cfg.lr, eps=cfg.adam_eps, fused=True)
        self._online_params: list[torch.Tensor] = list(self.online.parameters())
        self._target_params: list[torch.Tensor] = list(self.target.parameters())
        self.num_updates = 0

    def beta(self, updates: int | None = None) -> float:
        """The importance exponent to sample with at ``updates`` (default: now)."""
        n = self.num_updates if updates is None else updates
        return beta_schedule(n, self.cfg.beta_start, self.cfg.beta_updates)

    def update(
        self, batch: Mapping[str, ArrayLike], weights: ArrayLike | None = None
    ) -> tuple[dict[str, float], np.ndarray]:
        """One gradient step on a sampled batch.

        ``weights`` are the importance weights from prioritized replay, used as
        given (the replay normalises them); None means uniform. Returns the
        figures of the step and the new priorities, |TD error| + priority_eps
        as float64[B], from the networks before the step.
        """
        cfg = self.cfg
        b = batch_to_device({key: _column(batch, key) for key in COLUMNS}, self.device)
        action = b["action"].long()[:, None]
        # Autograd-free: the forward keeps its activations and QNetwork.backward_into sets the
        # gradients (the same as loss.backward(); tests/test_dqn.py checks): ~25% less CPU per update.
        n = len(action)
        if cfg.double:  # one online forward over obs and next_obs; the backward uses the obs rows
            q_both, acts = self.online.forward_keep(torch.cat([b["obs"].flatten(1).float(),
                                                               b["next_obs"].flatten(1).float()]))
            q, next_q_online = q_both[:n], q_both[n:]
            acts = [a[:n] for a in acts]
        else:
            q, acts = self.online.forward_keep(b["obs"])
        with torch.no_grad():
            q_sa = q.gather(1, action).squeeze(1)
            next_q_target = self.target.forward_keep(b["next_obs"])[0]
            if not cfg.double:
                next_q_online = next_q_target
            target = n_step_target(b["reward"].float(), b["discount"].float(), next_q_online, next_q_target, cfg.double)
            td = target - q_sa
            losses = F.huber_loss(q_sa, target, reduction="none", delta=cfg.huber_delta)
            # d(huber)/d(q_sa) = clamp(q_sa - target, -delta, delta); the loss is a (weighted) mean
            grad_sa = (-td).clamp_(-cfg.huber_delta, cfg.huber_delta)
            if weights is not None:
                w = to_device(weights, self.device).float()
                losses = losses * w
                grad_sa = grad_sa.mul_(w)
            loss = losses.mean()
            grad_q = torch.zeros_like(q).scatter_(1, action, grad_sa.div_(len(q_sa))[:, None])
        self.online.backward_into(acts, grad_q)
        with torch.no_grad():
            grads = [p.grad for p in self._online_params]
            grad_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))  # type: ignore[arg-type]
            if cfg.grad_clip is not None:  # as clip_grad_norm_: scale by max_norm / (norm + 1e-6) when above
                torch._foreach_mul_(grads, (cfg.grad_clip / (grad_norm + 1e-6)).clamp_(max=1.0))  # type: ignore[arg-type]
        self.optimizer.step()
        self.num_updates += 1
        self._follow_target()

        td_abs = td.abs()
        # One device-to-host copy for all figures.
        figures = torch.stack([loss, q_sa.mean(), td_abs.mean(), grad_norm]).cpu()
        metrics = dict(zip(("loss", "q_mean", "td_abs_mean", "grad_norm"), figures.tolist(), strict=True))
        priorities = (td_abs + cfg.priority_eps).double().cpu().numpy()
        return metrics, priorities

    def _follow_target(self) -> None:
        with torch.no_grad():
            if self.cfg.target_update == "polyak":
                torch._foreach_lerp_(self._target_params, self._online_params, self.cfg.tau)
            elif self.num_updates % self.cfg.target_period == 0:
                self.target.load_state_dict(self.online.state_dict())

    def weights(self) -> dict[str, np.ndarray]:
        """CPU float32 copies of the online state_dict, to publish."""
        return {
            key: np.ascontiguousarray(value.detach().to("cpu", torch.float32, copy=True).numpy())
            for key, value in self.online.state_dict().items()
        }

    def state(self) -> dict[str, Any]:
        """A checkpoint of plain tensors, dicts, lists and numbers (loads with weights_only=True).

        Tensors are CPU copies, so the checkpoint can be written while training goes on.
        """
        return {
            "algorithm": "dqn",
            "format": CHECKPOINT_FORMAT,
            "num_updates": self.num_updates,
            "online": cpu_copy(self.online.state_dict()),
            "target": cpu_copy(self.target.state_dict()),
            "optimizer": cpu_copy(self.optimizer.state_dict()),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("algorithm") != "dqn" or state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(
                f"not a DQN checkpoint of format {CHECKPOINT_FORMAT}: algorithm="
                f"{state.get('algorithm')!r}, format={state.get('format')!r}"
            )
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_updates = int(state["num_updates"])


def load_arrays(net: torch.nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Copy named arrays into ``net``'s state_dict after checking names and shapes.

    Weights come from the wire: a mismatch is a clear error and leaves the net
    untouched.
    """
    own = net.state_dict()
    missing = sorted(set(own) - set(arrays))
    extra = sorted(set(arrays) - set(own))
    if missing or extra:
        raise ValueError(f"weights do not fit the network: missing {missing}, unexpected {extra}")
    for key, tensor in own.items():
        shape = tuple(np.shape(arrays[key]))
        if shape != tuple(tensor.shape):
            raise ValueError(f"weights {key!r} have shape {shape}; the network needs {tuple(tensor.shape)}")
    with torch.no_grad():
        for key, tensor in own.items():
            tensor.copy_(to_device(np.asarray(arrays[key]), torch.device("cpu")))


def _make_builder(cfg: DQNConfig, envs: gym.vector.VectorEnv) -> NStepBuilder:
    return NStepBuilder.for_env(envs, cfg.n_step, cfg.gamma)


def _exploration(cfg: DQNConfig, index: int, num_actors: int, fleet_env_steps: int = 0) -> float:
    final = apex_epsilon(index, num_actors, cfg.epsilon, cfg.epsilon_alpha)
    return scheduled_epsilon(final, fleet_env_steps, cfg.epsilon_start, cfg.epsilon_decay_steps)


ALGORITHM = AlgorithmModule(
    name="dqn",
    check_env=check_env,
    make_policy=DQNPolicy,
    make_learner=DQNLearner,
    make_builder=_make_builder,
    exploration=_exploration,
)
