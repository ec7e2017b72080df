"""The A3C Builder: gradient workers and no learner (common/algorithms/builder.py).

Torch-free: the registry and the config read it; what it names is imported when made.
"""

from __future__ import annotations

from typing import Any

from rlfleet.common.algorithms import spaces
from rlfleet.common.algorithms.a3c.config import A3CConfig
from rlfleet.common.algorithms.adders import segment_adder
from rlfleet.common.algorithms.builder import Builder

ALLOWED = "Discrete (starting at 0) actions and a Box observation space"


def check_env(cfg: A3CConfig, observation_space: Any, action_space: Any, env_id: str | None = None) -> None:
    env = spaces.env_label(env_id)
    spaces.discrete_from_zero(cfg.name, env, action_space, ALLOWED)
    spaces.box_observations(cfg.name, env, observation_space)


BUILDER = Builder(
    name="a3c",
    config=A3CConfig,
    check_env=check_env,
    make_adder=lambda cfg, num_envs, obs, act, mode: segment_adder(cfg.n_steps, num_envs, obs, act, mode),
    policy="rlfleet.common.algorithms.a3c.policy:A3CPolicy",
    worker="rlfleet.common.algorithms.a3c.worker:A3CWorker",
    autoreset_mode="SameStep",  # rollouts of every slot end on the same vector step
)
