"""The Builder: everything the fleet needs to run one algorithm, in one object (Acme's builders).

Each algorithm folder's ``builder.py`` defines ``BUILDER``; the services and the serial runner ask
it, and nothing else, for:

- the replay table kinds its learner can train from (``table_kinds``; the experiment file picks one,
  rate limiter included) and the columns its adder writes (``make_adder(...).schema()``);
- the round a barrier learner runs (:meth:`Builder.make_round`: N updates on fresh batches, or every
  item of the round once);
- its policy (acting, with the algorithm's own exploration), its adder and its learner, or, for an
  experiment that trains through gradient workers, its worker (``make_worker``).

Policies, learners and workers are named as ``"module:Class"`` and imported when first made, so
the registry (and with it the config, and the replay and paramserver images) stays torch-free. Each
is made only after ``check_env`` accepted the env's spaces.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlfleet.common.algorithms.contract import Adder, EnvMismatch, GradientWorker, Learner, Policy
from rlfleet.common.algorithms.rounds import Round, round_of

if TYPE_CHECKING:
    import gymnasium as gym

# (cfg, observation_space, action_space, env_id) -> None, or raises EnvMismatch
EnvCheck = Callable[[Any, "gym.Space[Any]", "gym.Space[Any]", "str | None"], None]
# (cfg, num_envs, observation_space, action_space, autoreset_mode) -> Adder
AdderFactory = Callable[[Any, int, "gym.Space[Any]", "gym.Space[Any]", Any], Adder]


def load(path: str) -> Any:
    """The object a ``"module:attr"`` path names."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Builder:
    name: str
    config: type[Any]  # the pydantic class of the ``algorithm:`` section (with ``table_kinds``)
    check_env: EnvCheck
    make_adder: AdderFactory
    policy: str  # "module:Class": (cfg, observation_space, action_space, *, device, seed, act_seed) -> Policy
    learner: str | None = None  # "module:Class": (cfg, observation_space, action_space, *, device, seed, averager)
    worker: str | None = None  # "module:Class": like the policy, plus gradients(): A3C, HogWild
    # how the actors' vector envs reset (a gymnasium AutoresetMode value): "NextStep" spends a vector step on
    # each reset (the adder drops it); "SameStep" makes every vector step an env step of every slot, so
    # fixed-length segments end together, on barrier round boundaries
    autoreset_mode: str = "NextStep"

    @property
    def table_kinds(self) -> tuple[str, ...]:
        """Replay table kinds this algorithm's learner can train from."""
        return tuple(self.config.table_kinds)

    @property
    def has_workers(self) -> bool:
        """The algorithm can train through gradient workers (its config's ``trains_with_workers()`` says
        whether an experiment does: then the fleet runs no replay and no learner)."""
        return self.worker is not None

    def make_policy(self, cfg: Any, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                    **kwargs: Any) -> Policy:
        self.check_env(cfg, observation_space, action_space, None)
        policy: Policy = load(self.policy)(cfg, observation_space, action_space, **kwargs)
        return policy

    def make_learner(self, cfg: Any, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                     **kwargs: Any) -> Learner:
        if self.learner is None:
            raise EnvMismatch(f"algorithm {self.name} trains through gradient workers and the paramserver's"
                              " shard optimizers: it has no learner")
        self.check_env(cfg, observation_space, action_space, None)
        learner: Learner = load(self.learner)(cfg, observation_space, action_space, **kwargs)
        return learner

    def make_worker(self, cfg: Any, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                    **kwargs: Any) -> GradientWorker:
        if self.worker is None:
            raise EnvMismatch(f"algorithm {self.name} has no gradient worker; it trains with a learner")
        self.check_env(cfg, observation_space, action_space, None)
        worker: GradientWorker = load(self.worker)(cfg, observation_space, action_space, **kwargs)
        return worker

    def make_round(self, learner: Learner, updates_per_round: int, envs: int, steps_per_round: int) -> Round:
        """The barrier round of ``envs`` env slots in all (live actors x env.num_envs), each acting
        ``steps_per_round`` vector steps, for ``learner``."""
        return round_of(learner.data, updates_per_round, envs, steps_per_round)
