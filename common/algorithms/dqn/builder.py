"""The DQN Builder: what the fleet needs to run Ape-X DQN (common/algorithms/builder.py).

Torch-free: the registry and the config read it; what it names is imported when made.
"""

from __future__ import annotations

from typing import Any

from rlfleet.common.algorithms import spaces
from rlfleet.common.algorithms.adders import config_transitions
from rlfleet.common.algorithms.builder import Builder
from rlfleet.common.algorithms.dqn.config import DQNConfig
from rlfleet.common.algorithms.torsos import choose_torso


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
    policy="rlfleet.common.algorithms.dqn.policy:DQNPolicy",
    learner="rlfleet.common.algorithms.dqn.learner:DQNLearner",
    worker="rlfleet.common.algorithms.dqn.worker:DQNWorker",  # hogwild: true
)
