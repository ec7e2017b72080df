"""The SAC Builder: what the fleet needs to run it (common/algorithms/builder.py).

Torch-free: the registry and the config read it; what it names is imported when made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.algorithms.builder import Builder
from common.algorithms.contract import EnvMismatch
from common.algorithms.sac.config import SACConfig

if TYPE_CHECKING:
    import gymnasium as gym

    from common.algorithms.adders.nstep import NStepAdder

ALLOWED = "Box actions with finite low < high in every dimension"


def check_env(cfg: SACConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any],
              env_id: str | None = None) -> None:
    import gymnasium as gym
    import numpy as np

    env = f"env {env_id}" if env_id else "the env"
    if not isinstance(action_space, gym.spaces.Box):
        raise EnvMismatch(f"algorithm {cfg.name} needs continuous actions; {env} has {action_space};"
                          f" allowed: {ALLOWED}")
    if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
        raise EnvMismatch(f"algorithm {cfg.name} scales actions to the action space's bounds; {env} has"
                          f" {action_space} with infinite bounds; allowed: {ALLOWED}")
    if not (action_space.high > action_space.low).all():
        raise EnvMismatch(f"algorithm {cfg.name}: {env} has {action_space} with high <= low; allowed: {ALLOWED}")
    if not isinstance(observation_space, gym.spaces.Box):
        raise EnvMismatch(
            f"algorithm {cfg.name} needs a Box observation space (flattened into an MLP); {env} has {observation_space}"
        )


def make_adder(cfg: SACConfig, num_envs: int, observation_space: gym.Space[Any], action_space: gym.Space[Any],
               autoreset_mode: Any) -> NStepAdder:
    import numpy as np

    from common.algorithms.adders.nstep import NStepAdder

    if observation_space.shape is None or action_space.shape is None:
        raise EnvMismatch(f"spaces {observation_space}, {action_space} need shapes")
    return NStepAdder(num_envs, cfg.n_step, cfg.gamma, tuple(observation_space.shape), autoreset_mode,
                      action_shape=tuple(action_space.shape), action_dtype=np.float32)


BUILDER = Builder(
    name="sac",
    config=SACConfig,
    check_env=check_env,
    make_adder=make_adder,
    policy="common.algorithms.sac.policy:SACPolicy",
    learner="common.algorithms.sac.learner:SACLearner",
)
