"""The registry of algorithms: each a folder ``common/algorithms/<name>/`` whose ``builder.py``
defines ``BUILDER = Builder(...)``, named in :data:`BUILTIN`; or one added with :func:`register`.

Torch-free on purpose: :mod:`rlfleet.common.config` builds the experiment's ``algorithm:``
section from :func:`config_classes`, and the replay and paramserver images have
no torch. An algorithm folder's ``__init__`` therefore imports only its config
and defers its networks to the factories.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlfleet.common.algorithms.builder import Builder
from rlfleet.common.algorithms.contract import UnknownAlgorithm

if TYPE_CHECKING:
    import gymnasium as gym

_PACKAGE = "rlfleet.common.algorithms"
# The built-in algorithms: adding one is its folder and its line here.
BUILTIN = (
    "a3c",
    "dqn",
    "ppo",
    "sac",
    "td3",
)
_REGISTRY: dict[str, Builder] = {}


def register(module: Builder, replace: bool = False) -> Builder:
    """Add an algorithm defined elsewhere (a plugin, a test). Its config is not part of the
    experiment file's ``algorithm:`` union, which is built from the built-in folders."""
    if module.name in _REGISTRY and not replace and _REGISTRY[module.name] is not module:
        raise ValueError(f"algorithm {module.name!r} is already registered")
    _REGISTRY[module.name] = module
    return module


def get(name: str) -> Builder:
    """The algorithm called ``name``: registered, or the folder ``common/algorithms/<name>/``."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    module = _load_builtin(name)
    if module is None:
        raise UnknownAlgorithm(f"unknown algorithm {name!r}; available: {', '.join(available())}")
    return register(module)


def available() -> list[str]:
    return sorted(set(_REGISTRY) | set(builtin_names()))


def builtin_names() -> list[str]:
    """The algorithms whose folders are under common/algorithms/."""
    return sorted(BUILTIN)


def config_classes() -> list[type[Any]]:
    """The config class of every built-in algorithm (for the ``algorithm:`` union)."""
    return [get(name).config for name in builtin_names()]


def check_env(cfg: Any, observation_space: gym.Space[Any], action_space: gym.Space[Any],
              env_id: str | None = None) -> None:
    """Raise :class:`EnvMismatch` naming the algorithm, the env and its space if they do not fit."""
    get(cfg.name).check_env(cfg, observation_space, action_space, env_id)


def _load_builtin(name: str) -> Builder | None:
    if name not in BUILTIN:
        return None
    builder = importlib.import_module(f"{_PACKAGE}.{name}.builder").BUILDER
    if not isinstance(builder, Builder) or builder.name != name:
        raise TypeError(f"{_PACKAGE}.{name}.builder.BUILDER is not the Builder of {name!r}")
    return builder
