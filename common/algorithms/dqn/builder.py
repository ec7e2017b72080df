"""The DQN Builder: what the fleet needs to run it (common/algorithms/builder.py).

Torch-free: the registry and the config read it; what it names is imported when made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.algorithms.builder import Builder
from common.algorithms.contract import EnvMismatch
from common.algorithms.dqn.config import DQNConfig
from common.algorithms.torsos import choose_torso

if TYPE_CHECKING:
    import gymnasium as gym

    from common.algorithms.adders.nstep import NStepAdder


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


def make_adder(cfg: DQNConfig, num_envs: int, observation_space: gym.Space[Any], action_space: gym.Space[Any],
               autoreset_mode: Any) -> NStepAdder:
    from common.algorithms.adders.nstep import NStepAdder
    from common.algorithms.adders.vector_steps import stored_obs_dtype

    shape = observation_space.shape
    if shape is None:
        raise EnvMismatch(f"observation space {observation_space} has no shape")
    return NStepAdder(num_envs, cfg.n_step, cfg.gamma, tuple(shape), autoreset_mode,
                      obs_dtype=stored_obs_dtype(observation_space))


BUILDER = Builder(
    name="dqn",
    config=DQNConfig,
    check_env=check_env,
    make_adder=make_adder,
    policy="common.algorithms.dqn.policy:DQNPolicy",
    learner="common.algorithms.dqn.learner:DQNLearner",
    worker="common.algorithms.dqn.worker:DQNWorker",
)
