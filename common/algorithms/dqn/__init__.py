"""Ape-X DQN: double Q, dueling heads, n-step returns, prioritized replay.

Horgan et al. 2018, "Distributed Prioritized Experience Replay". The folder:
:mod:`.config` (the ``algorithm:`` section), :mod:`.networks` (the Q-network and
its numpy acting path), :mod:`.policy` (epsilon-greedy acting with the Ape-X
schedule, initial priorities), :mod:`.learner` (the update), :mod:`.worker`
(``hogwild: true``: the same loss computed by each actor on its own buffer) and
the shared n-step adder (:mod:`common.algorithms.adders.nstep`).

This module stays torch-free (the config reads it): the factories import the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.algorithms.contract import AlgorithmModule, EnvMismatch
from common.algorithms.dqn.config import DQNConfig
from common.algorithms.torsos import choose_torso

if TYPE_CHECKING:
    import gymnasium as gym

    from common.algorithms.adders.nstep import NStepAdder
    from common.algorithms.dqn.learner import DQNLearner
    from common.algorithms.dqn.policy import DQNPolicy
    from common.algorithms.dqn.worker import DQNWorker


def check_env(cfg: DQNConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any],
              env_id: str | None = None) -> None:
    import gymnasium as gym

    env = f"env {env_id}" if env_id else "the env"
    if not isinstance(action_space, gym.spaces.Discrete):
        raise EnvMismatch(f"algorithm {cfg.name} needs a Discrete action space; {env} has {action_space}")
    if int(action_space.start) != 0:
        raise EnvMismatch(f"algorithm {cfg.name} needs Discrete actions starting at 0; {env} has {action_space}")
    if not isinstance(observation_space, gym.spaces.Box):
        raise EnvMismatch(
            f"algorithm {cfg.name} needs a Box observation space (flattened into an MLP); {env} has {observation_space}"
        )
    choose_torso(cfg.torso, observation_space, cfg.name, env)


def make_policy(cfg: DQNConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                **kwargs: Any) -> DQNPolicy:
    from common.algorithms.dqn.policy import DQNPolicy

    return DQNPolicy(cfg, observation_space, action_space, **kwargs)


def make_learner(cfg: DQNConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                 **kwargs: Any) -> DQNLearner:
    from common.algorithms.dqn.learner import DQNLearner

    return DQNLearner(cfg, observation_space, action_space, **kwargs)


def make_adder(cfg: DQNConfig, num_envs: int, observation_space: gym.Space[Any], action_space: gym.Space[Any],
               autoreset_mode: Any) -> NStepAdder:
    from common.algorithms.adders.nstep import NStepAdder
    from common.algorithms.adders.vector_steps import stored_obs_dtype

    shape = observation_space.shape
    if shape is None:
        raise EnvMismatch(f"observation space {observation_space} has no shape")
    return NStepAdder(num_envs, cfg.n_step, cfg.gamma, tuple(shape), autoreset_mode,
                      obs_dtype=stored_obs_dtype(observation_space))


def make_worker(cfg: DQNConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                **kwargs: Any) -> DQNWorker:
    from common.algorithms.dqn.worker import DQNWorker

    return DQNWorker(cfg, observation_space, action_space, **kwargs)


ALGORITHM = AlgorithmModule(
    name="dqn",
    config=DQNConfig,
    check_env=check_env,
    make_policy=make_policy,
    make_adder=make_adder,
    make_learner=make_learner,
    make_worker=make_worker,  # hogwild: true
)
