"""The PPO Builder: what the fleet needs to run it (common/algorithms/builder.py).

Torch-free: the registry and the config read it; what it names is imported when made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.algorithms.builder import Builder
from common.algorithms.contract import EnvMismatch
from common.algorithms.ppo.config import PPOConfig
from common.algorithms.torsos import choose_torso

if TYPE_CHECKING:
    import gymnasium as gym

    from common.algorithms.ppo.segments import SegmentAdder

ALLOWED = "Discrete (starting at 0), or Box with finite low and high"


def check_env(cfg: PPOConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any],
              env_id: str | None = None) -> None:
    import gymnasium as gym
    import numpy as np

    env = f"env {env_id}" if env_id else "the env"
    if isinstance(action_space, gym.spaces.Discrete):
        if int(action_space.start) != 0:
            raise EnvMismatch(f"algorithm {cfg.name}: {env} has action space {action_space}; allowed: {ALLOWED}")
    elif isinstance(action_space, gym.spaces.Box):
        if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            raise EnvMismatch(
                f"algorithm {cfg.name} clips actions to the action space's bounds; {env} has {action_space}"
                f" with infinite bounds; allowed: {ALLOWED}"
            )
    else:
        raise EnvMismatch(f"algorithm {cfg.name}: {env} has action space {action_space}; allowed: {ALLOWED}")
    if not isinstance(observation_space, gym.spaces.Box):
        raise EnvMismatch(
            f"algorithm {cfg.name} needs a Box observation space (flattened into an MLP); {env} has {observation_space}"
        )
    if choose_torso(cfg.torso, observation_space, cfg.name, env) == "nature_cnn" and cfg.obs_norm:
        raise EnvMismatch(f"algorithm {cfg.name}: obs_norm normalises flat observations; {env} gives images, which"
                          " the CNN scales to [0, 1] on the learner's device; allowed for images: obs_norm false")


def make_adder(cfg: PPOConfig, num_envs: int, observation_space: gym.Space[Any], action_space: gym.Space[Any],
               autoreset_mode: Any) -> SegmentAdder:
    from common.algorithms.ppo.segments import SegmentAdder

    # the policy's extras the learner reads (raw_action is stored as the action)
    extras = {"logp": ("float32", ()), "value": ("float32", ())}
    return SegmentAdder(num_envs, cfg.segment_length, observation_space, action_space, autoreset_mode, extras)


BUILDER = Builder(
    name="ppo",
    config=PPOConfig,
    check_env=check_env,
    make_adder=make_adder,
    policy="common.algorithms.ppo.policy:PPOPolicy",
    learner="common.algorithms.ppo.learner:PPOLearner",
    autoreset_mode="SameStep",
)
