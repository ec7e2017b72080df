"""The whole experiment file: its sections, and the checks that span several of them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from rlfleet.common.config.algorithm import AlgorithmConfig, default_algorithm
from rlfleet.common.config.planning import PlanningConfig, planning_problems
from rlfleet.common.config.sections import (
    ActorConfig,
    EnvConfig,
    EvaluatorConfig,
    LearnerConfig,
    LoggingConfig,
    MetricsConfig,
    NetworkConfig,
    ParamServerConfig,
    ReplayConfig,
    SecurityConfig,
    Strict,
)
from rlfleet.common.wire.codec import Limits


class Experiment(Strict):
    name: str = Field("experiment", pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 0
    sync: Literal["barrier", "async"] = "async"
    env: EnvConfig = Field(default_factory=lambda: EnvConfig())
    algorithm: AlgorithmConfig = Field(default_factory=default_algorithm)
    actor: ActorConfig = Field(default_factory=lambda: ActorConfig())
    evaluator: EvaluatorConfig = Field(default_factory=lambda: EvaluatorConfig())
    replay: ReplayConfig = Field(default_factory=lambda: ReplayConfig())
    learner: LearnerConfig = Field(default_factory=lambda: LearnerConfig())
    paramserver: ParamServerConfig = Field(default_factory=lambda: ParamServerConfig())
    network: NetworkConfig = Field(default_factory=lambda: NetworkConfig())
    metrics: MetricsConfig = Field(default_factory=lambda: MetricsConfig())
    logging: LoggingConfig = Field(default_factory=lambda: LoggingConfig())
    security: SecurityConfig = Field(default_factory=lambda: SecurityConfig())
    planning: PlanningConfig = Field(default_factory=lambda: PlanningConfig())
    run_dir: str = Field("runs/current", description="where this run writes logs, CSVs and checkpoints")
    learners: Annotated[int, Field(ge=1, le=256)] = Field(
        1, description="data-parallel learner processes (ranks of one torch.distributed group); each samples "
        "1/learners of every batch, their gradients are averaged, the first publishes and checkpoints")

    @property
    def limits(self) -> Limits:
        """What servers decode (the largest message from ``network.max_message_mib``)."""
        return Limits(max_message_bytes=self.network.max_message_mib << 20)

    @model_validator(mode="after")
    def _cross(self) -> Experiment:
        problems = []
        workers = self.algorithm.trains_with_workers()  # no replay, no learner
        tables = {t.name: t for t in self.replay.tables}
        if self.learner.table not in tables:
            problems.append(f"learner.table={self.learner.table!r}: allowed: one of {sorted(tables)}")
        if len(self.network.replay) != self.replay.shards:
            problems.append(
                f"network.replay has {len(self.network.replay)} addresses but replay.shards="
                f"{self.replay.shards}; allowed: one address per shard"
            )
        if len(self.network.paramserver) != self.paramserver.shards:
            problems.append(
                f"network.paramserver has {len(self.network.paramserver)} addresses but "
                f"paramserver.shards={self.paramserver.shards}; allowed: one address per shard"
            )
        table = tables.get(self.learner.table)
        if self.sync == "barrier" and table is not None and table.samples_per_insert is not None:
            problems.append(
                f"replay.tables[{self.learner.table}].samples_per_insert={table.samples_per_insert}"
                " with sync=barrier: the limiter could hold the learner inside a round while actors"
                " wait for the next version (deadlock); allowed: null (the round fixes the ratio)"
            )
        allowed = tuple(type(self.algorithm).table_kinds)
        if table is not None and not workers and table.kind not in allowed:
            problems.append(
                f"replay.tables[{table.name}].kind={table.kind!r} with algorithm {self.algorithm.name};"
                f" allowed: {', '.join(allowed)}"
            )
        if self.sync == "barrier" and self.paramserver.shards > 1 and workers:
            problems.append(f"paramserver.shards={self.paramserver.shards} with sync=barrier and algorithm "
                            f"{self.algorithm.name}: a synchronous gradient round is counted by the one shard that"
                            " holds the registry; allowed: paramserver.shards=1, or sync=async")
        if self.learners > 1:
            if self.sync == "barrier":
                problems.append(f"learners={self.learners} with sync=barrier: several learners train in async "
                                "mode only; allowed: learners=1, or sync=async")
            for name in type(self.algorithm).per_rank_fields:
                value = getattr(self.algorithm, name)
                if value % self.learners:
                    problems.append(f"algorithm.{name}={value} with learners={self.learners}: each learner takes an"
                                    f" equal share; allowed: a multiple of {self.learners}")
        problems += self.algorithm.check_fleet(self.sync, self.actor.count, self.env.num_envs,
                                               self.actor.steps_per_round)
        problems += planning_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def bind_address(self, service: Literal["replay", "paramserver"], shard: int) -> str:
        """Where a shard binds: its address's port on ``network.interface``'s address (resolved on this
        host) if set, else on ``network.bind_host``."""
        host = self.network.bind_host
        if self.network.interface is not None:
            from rlfleet.common.netif import interface_address  # reads this host's interfaces: only where one binds

            host = interface_address(self.network.interface)
        return bind_address(getattr(self.network, service)[shard], host)


def bind_address(connect: str, bind_host: str = "*") -> str:
    """The address a server binds for a connect address (tcp: same port on bind_host)."""
    if connect.startswith("tcp://"):
        port = connect.rsplit(":", 1)[1]
        return f"tcp://{bind_host}:{port}"
    return connect
