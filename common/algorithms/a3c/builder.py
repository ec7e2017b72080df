"""The A3C Builder: what the fleet needs to run it (common/algorithms/builder.py).

Torch-free: the registry and the config read it; what it names is imported when made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.algorithms.a3c.config import A3CConfig
from common.algorithms.builder import Builder
from common.algorithms.contract import EnvMismatch

if TYPE_CHECKING:
    import gymnasium as gym

    from common.algorithms.ppo.segments import SegmentAdder

ALLOWED = "Discrete (starting at 0) actions and a Box observation space"


def check_env(cfg: A3CConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any],
              env_id: str | None = None) -> None:
    import gymnasium as gym

    env = f"env {env_id}" if env_id else "the env"
    if not isinstance(action_space, gym.spaces.Discrete) or int(action_space.start) != 0:
        raise EnvMismatch(f"algorithm {cfg.name}: {env} has action space {action_space}; allowed: {ALLOWED}")
    if not isinstance(observation_space, gym.spaces.Box):
        raise EnvMismatch(f"algorithm {cfg.name}: {env} has observation space {observation_space}; allowed: {ALLOWED}")


def make_adder(cfg: A3CConfig, num_envs: int, observation_space: gym.Space[Any], action_space: gym.Space[Any],
               autoreset_mode: Any) -> SegmentAdder:
    from common.algorithms.ppo.segments import SegmentAdder

    return SegmentAdder(num_envs, cfg.n_steps, observation_space, action_space, autoreset_mode)


BUILDER = Builder(
    name="a3c",
    config=A3CConfig,
    check_env=check_env,
    make_adder=make_adder,
    policy="common.algorithms.a3c.policy:A3CPolicy",
    worker="common.algorithms.a3c.worker:A3CWorker",
    autoreset_mode="SameStep",
)
