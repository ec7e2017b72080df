"""What an algorithm's ``check_env`` asks of an env's spaces, each check once, each refusal naming the
algorithm, the env, its space and what is allowed. Torch-free: builders call these at start-up."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlfleet.common.algorithms.contract import EnvMismatch


def env_label(env_id: str | None) -> str:
    return f"env {env_id}" if env_id else "the env"


def box_observations(name: str, env: str, observation_space: Any) -> None:
    """A Box observation space (flattened into an MLP, or images for a CNN torso)."""
    import gymnasium as gym

    if not isinstance(observation_space, gym.spaces.Box):
        raise EnvMismatch(
            f"algorithm {name} needs a Box observation space (flattened into an MLP); {env} has {observation_space}")


def is_discrete(action_space: Any) -> bool:
    import gymnasium as gym

    return isinstance(action_space, gym.spaces.Discrete)


def discrete_from_zero(name: str, env: str, action_space: Any, allowed: str | None = None) -> None:
    """Discrete actions numbered from 0 (what a network's outputs index)."""
    suffix = f"; allowed: {allowed}" if allowed else ""
    if not is_discrete(action_space):
        raise EnvMismatch(f"algorithm {name} needs a Discrete action space; {env} has {action_space}{suffix}")
    if int(action_space.start) != 0:
        raise EnvMismatch(f"algorithm {name} needs Discrete actions starting at 0; {env} has {action_space}{suffix}")


def bounded_box(name: str, env: str, action_space: Any, why: str, allowed: str) -> None:
    """Box actions with finite bounds, high > low in every dimension (``why``: what the bounds are for)."""
    import gymnasium as gym

    if not isinstance(action_space, gym.spaces.Box):
        raise EnvMismatch(f"algorithm {name} needs continuous actions; {env} has {action_space}; allowed: {allowed}")
    if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
        raise EnvMismatch(f"algorithm {name} {why}; {env} has {action_space} with infinite bounds; allowed: {allowed}")
    if not (action_space.high > action_space.low).all():
        raise EnvMismatch(f"algorithm {name}: {env} has {action_space} with high <= low; allowed: {allowed}")


CONTINUOUS = "Box actions with finite low < high in every dimension"


def continuous_control(cfg: Any, observation_space: Any, action_space: Any, env_id: str | None = None) -> None:
    """The env check of an actor-critic that scales its actions to the bounds (SAC, TD3): Box actions
    with finite bounds, Box observations."""
    env = env_label(env_id)
    bounded_box(cfg.name, env, action_space, "scales actions to the action space's bounds", CONTINUOUS)
    box_observations(cfg.name, env, observation_space)
