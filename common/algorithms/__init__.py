"""The algorithm registry.

An algorithm is one module ``common/algorithms/<name>.py`` that defines
``ALGORITHM = AlgorithmModule(...)``: its network, its acting policy (used by
actors), its transition builder, its learner core (used by the learner) and a
check that the env fits. Services only ever go through :func:`get`, so adding
an algorithm is that module plus its config class in ``common/config.py``.
Algorithms defined elsewhere (plugins, tests) are added with :func:`register`.

Nothing here opens sockets: the services wire these objects to the wire.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

Columns = dict[str, np.ndarray]


class Policy(Protocol):
    """Acting side: lives in every actor, fed weights from the paramserver."""

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None: ...

    def act(self, obs: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray: ...

    def initial_priorities(self, columns: Mapping[str, np.ndarray]) -> np.ndarray: ...


class TransitionBuilder(Protocol):
    """Turns vector-env steps into the columns an actor inserts into replay."""

    def reset(self, obs: np.ndarray) -> None: ...

    def add(
        self,
        actions: np.ndarray,
        next_obs: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        infos: Mapping[str, Any] | None = None,
    ) -> Columns: ...


class LearnerCore(Protocol):
    """Training side: lives in the learner service; no sockets."""

    num_updates: int
    device: Any  # torch.device the learner trains on

    def beta(self, updates: int | None = None) -> float: ...

    def update(self, batch: Mapping[str, Any], weights: Any = None) -> tuple[dict[str, float], np.ndarray]: ...

    def weights(self) -> dict[str, np.ndarray]: ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class AlgorithmModule:
    """What an algorithm gives the services. ``cfg`` is its config section."""

    name: str
    # (cfg, observation_space, action_space, env_id) -> None, or raises EnvMismatch
    check_env: Callable[[Any, gym.Space, gym.Space, str | None], None]
    # (cfg, observation_space, action_space, *, device, seed) -> Policy
    make_policy: Callable[..., Policy]
    # (cfg, observation_space, action_space, *, device, seed) -> LearnerCore
    make_learner: Callable[..., LearnerCore]
    # (cfg, vector_env) -> TransitionBuilder
    make_builder: Callable[[Any, Any], TransitionBuilder]
    # (cfg, actor_index, num_actors, fleet_env_steps) -> the exploration parameter act() takes
    exploration: Callable[[Any, int, int, int], float]
    # replay table kinds this algorithm can train from
    table_kinds: tuple[str, ...] = ("uniform", "prioritized")


class UnknownAlgorithm(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class EnvMismatch(ValueError):
    """The env's spaces do not fit the algorithm (e.g. DQN on continuous actions)."""


_REGISTRY: dict[str, AlgorithmModule] = {}


def register(module: AlgorithmModule, replace: bool = False) -> AlgorithmModule:
    if module.name in _REGISTRY and not replace and _REGISTRY[module.name] is not module:
        raise ValueError(f"algorithm {module.name!r} is already registered")
    _REGISTRY[module.name] = module
    return module


def get(name: str) -> AlgorithmModule:
    """The algorithm called ``name``: registered, or ``common/algorithms/<name>.py``."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    module = _load_builtin(name)
    if module is None:
        raise UnknownAlgorithm(f"unknown algorithm {name!r}; available: {', '.join(available())}")
    return register(module)


def available() -> list[str]:
    names = set(_REGISTRY)
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_") and _load_builtin(info.name) is not None:
            names.add(info.name)
    return sorted(names)


def check_env(cfg: Any, observation_space: gym.Space, action_space: gym.Space, env_id: str | None = None) -> None:
    """Raise :class:`EnvMismatch` naming the algorithm, the env and its space if they do not fit."""
    get(cfg.name).check_env(cfg, observation_space, action_space, env_id)


def _load_builtin(name: str) -> AlgorithmModule | None:
    if not name.isidentifier() or name.startswith("_"):
        return None
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"{__name__}.{name}":
            return None
        raise
    algorithm = getattr(module, "ALGORITHM", None)
    return algorithm if isinstance(algorithm, AlgorithmModule) and algorithm.name == name else None


__all__ = [
    "AlgorithmModule",
    "EnvMismatch",
    "LearnerCore",
    "Policy",
    "TransitionBuilder",
    "UnknownAlgorithm",
    "available",
    "check_env",
    "get",
    "register",
]
