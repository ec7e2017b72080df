"""A3C (Mnih et al. 2016) on the fleet: gradient workers and the paramserver's shard optimizers.

No replay and no learner process: every actor is a gradient worker (services/actor/worker.py)
that acts with the weights it pulled, computes the n-step advantage actor-critic gradient on its
own rollouts (:mod:`.worker`) and pushes it; each paramserver shard applies its slice with its
own optimizer (``paramserver.gradients``) and publishes the result as the next version. The
folder: :mod:`.config`, :mod:`.networks` (shared torso, policy and value heads), :mod:`.policy`
(numpy acting, also the evaluator's), :mod:`.worker` (the loss and its gradient).

This module stays torch-free (the config reads it): the factories import the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.algorithms.a3c.config import A3CConfig
from common.algorithms.contract import AlgorithmModule, EnvMismatch

if TYPE_CHECKING:
    import gymnasium as gym

    from common.algorithms.a3c.policy import A3CPolicy
    from common.algorithms.a3c.worker import A3CWorker
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


def make_policy(cfg: A3CConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                **kwargs: Any) -> A3CPolicy:
    from common.algorithms.a3c.policy import A3CPolicy

    return A3CPolicy(cfg, observation_space, action_space, **kwargs)


def make_worker(cfg: A3CConfig, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                **kwargs: Any) -> A3CWorker:
    from common.algorithms.a3c.worker import A3CWorker

    return A3CWorker(cfg, observation_space, action_space, **kwargs)


def make_learner(cfg: A3CConfig, *args: Any, **kwargs: Any) -> Any:
    raise EnvMismatch(f"algorithm {cfg.name} trains through gradient workers and the paramserver's shard"
                      " optimizers: it has no learner")


def make_adder(cfg: A3CConfig, num_envs: int, observation_space: gym.Space[Any], action_space: gym.Space[Any],
               autoreset_mode: Any) -> SegmentAdder:
    from common.algorithms.ppo.segments import SegmentAdder

    return SegmentAdder(num_envs, cfg.n_steps, observation_space, action_space, autoreset_mode)


ALGORITHM = AlgorithmModule(
    name="a3c",
    config=A3CConfig,
    check_env=check_env,
    make_policy=make_policy,
    make_adder=make_adder,
    make_learner=make_learner,
    make_worker=make_worker,
    autoreset_mode="SameStep",  # rollouts of every slot end on the same vector step
)
