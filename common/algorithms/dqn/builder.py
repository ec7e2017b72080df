"""The DQN Builder: what the fleet needs to run Ape-X DQN (common/algorithms/builder.py).

Torch-free: the registry and the config read it; what it names is imported when made.
"""

from __future__ import annotations

from typing import Any

from common.algorithms import spaces
from common.algorithms.adders import config_transitions
from common.algorithms.builder import Builder
from common.algorithms.dqn.config import DQNConfig
from common.algorithms.torsos import choose_torso


def check_env(cfg: DQNConfig, observation_space: Any, action_space: Any, env_id: str | None = None) -> None:
    env = spaces.env_label(env_id)
    spaces.discrete_from_zero(cfg.name, env, action_space)
    spaces.box_observations(cfg.name, env, observation_space)
    choose_torso(cfg.torso, observation_space, cfg.name, env)


BUILDER = Builder(
    name="dqn",
    config=DQNConfig,
    check_env=check_env,
    make_adder=config_transitions,  # n-step transitions (cfg.n_step, cfg.gamma)
    policy="common.algorithms.dqn.policy:DQNPolicy",
    learner="common.algorithms.dqn.learner:DQNLearner",
    worker="common.algorithms.dqn.worker:DQNWorker",  # hogwild: true
)
