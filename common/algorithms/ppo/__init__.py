"""PPO (Schulman et al. 2017) on the fleet: DPPO on the barrier, APPO async.

The folder: :mod:`.config` (the ``algorithm:`` section), :mod:`.networks`
(separate actor and critic MLPs, the Gaussian log-std, observation
normalisation), :mod:`.policy` (numpy acting: Categorical or diagonal
Gaussian), :mod:`.segments` (the adder: T-step trajectory segments),
:mod:`.losses` (GAE and the loss pieces) and :mod:`.learner` (epochs x
minibatches over a batch of segments).

This module stays torch-free (the config reads it): the factories import the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.algorithms.contract import AlgorithmModule, EnvMismatch
from common.algorithms.ppo.config import PPOConfig
from common.algorithms.torsos import choose_torso

if TYPE_CHECKING:
    import gymnasium as gym

    from common.algorithms.ppo.learner import PPOLearner
    from common.algorithms.ppo.policy import PPOPolicy
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


def make_policy(cfg: PPOConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                **kwargs: Any) -> PPOPolicy:
    from common.algorithms.ppo.policy import PPOPolicy

    return PPOPolicy(cfg, observation_space, action_space, **kwargs)


def make_learner(cfg: PPOConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                 **kwargs: Any) -> PPOLearner:
    from common.algorithms.ppo.learner import PPOLearner

    return PPOLearner(cfg, observation_space, action_space, **kwargs)


def make_adder(cfg: PPOConfig, num_envs: int, observation_space: gym.Space[Any], action_space: gym.Space[Any],
               autoreset_mode: Any) -> SegmentAdder:
    from common.algorithms.ppo.segments import SegmentAdder

    # the policy's extras the learner reads (raw_action is stored as the action)
    extras = {"logp": ("float32", ()), "value": ("float32", ())}
    return SegmentAdder(num_envs, cfg.segment_length, observation_space, action_space, autoreset_mode, extras)


ALGORITHM = AlgorithmModule(
    name="ppo",
    config=PPOConfig,
    check_env=check_env,
    make_policy=make_policy,
    make_adder=make_adder,
    make_learner=make_learner,
    autoreset_mode="SameStep",  # segments of every slot end on the same vector step: a barrier round's end
)
