"""The ``planning:`` section: parallel Dyna-Q (a world model and planning workers).

A world-model learner (the ``modeler`` service) fits the dynamics, reward and
termination of the real env on the real table's transitions and publishes the
model to the paramserver under its own name; planners roll it forward from real
start states with the current policy and insert the imagined transitions into
their own table; the learner samples that table for ``imagined_ratio`` of its
items while the model's validation error is below ``gate``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from rlfleet.common.config.sections import PosFloat, PosInt, Strict

if TYPE_CHECKING:
    from rlfleet.common.config.experiment import Experiment

PLANNING_MODEL = "world_model"  # the paramserver model name the world model is published under


class WorldModelConfig(Strict):
    hidden: list[PosInt] = Field([200, 200], min_length=1, description="hidden layer sizes of the model's MLP")
    lr: PosFloat = Field(1e-3, description="Adam learning rate")
    weight_decay: Annotated[float, Field(ge=0)] = Field(1e-5, description="Adam weight decay")
    batch_size: PosInt = Field(256, description="real transitions per update")
    holdout: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.1, description="fraction of the real transitions (chosen by replay key) never trained on: the validation"
        " split the gate reads")
    updates_per_s: PosFloat | None = Field(
        20.0, description="at most this many model updates per second (null: as fast as the CPU goes); the model"
        " needs far fewer updates than the Q-network, and the cores are shared")
    publish_every: PosInt = Field(25, description="model updates between published versions")
    checkpoint_every_s: PosFloat = Field(30.0, description="seconds between modeler checkpoints")
    torch_threads: PosInt = Field(1, description="torch intra-op threads of the modeler")


class PlanningConfig(Strict):
    enabled: bool = Field(False, description="run a world-model learner and planners (async only)")
    table: str = Field("imagined", description="replay table planners insert into (same columns as the real one)")
    imagined_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        0.5, description="fraction of the learner's sampled items drawn from the imagined table while the gate is"
        " open (whole batches, interleaved with real ones)")
    rollout_length: PosInt = Field(5, description="model steps of one imagined rollout from a real start state")
    rollouts: PosInt = Field(64, description="imagined rollouts each planner steps at once (its batch)")
    gate: PosFloat = Field(
        0.05, description="the model's validation error (mean of the normalised squared errors of next "
        "observation and reward, plus the termination error rate) below which imagined data is made and used")
    random_actions: Annotated[float, Field(ge=0, le=1)] = Field(
        0.0, description="fraction of imagined steps that take a uniformly random action instead of the policy's"
        " (on top of the policy's own exploration): exploring in imagination costs no real step")
    planners: Annotated[int, Field(ge=0, le=256)] = Field(
        2, description="planners `rlfleet up` starts (compose: --scale planner=N)")
    poll_every: PosInt = Field(20, description="rollout batches between a planner's weight polls")
    model: WorldModelConfig = Field(default_factory=lambda: WorldModelConfig())


def planning_problems(cfg: Experiment) -> list[str]:
    """What in ``cfg`` does not fit planning (nothing when planning is off); each names field, value, allowed."""
    p = cfg.planning
    if not p.enabled:
        return []
    problems = []
    tables = {t.name: t for t in cfg.replay.tables}
    if p.table == cfg.learner.table:
        problems.append(f"planning.table={p.table!r} is the learner's real table; allowed: a table of its own")
    elif p.table not in tables:
        problems.append(f"planning.table={p.table!r}: allowed: one of {sorted(tables)} (declare it in replay.tables)")
    else:
        kind = tables[p.table].kind
        allowed = tuple(type(cfg.algorithm).table_kinds)
        if kind not in allowed:
            problems.append(f"replay.tables[{p.table}].kind={kind!r}: allowed: {', '.join(allowed)}")
    if cfg.sync == "barrier":
        problems.append("planning.enabled with sync=barrier: a barrier round is each actor's real env steps on one"
                        " version and the learner's updates for it; imagined steps belong to no round and the"
                        " planners' versions are not the round's; allowed: sync=async")
    if cfg.algorithm.trains_with_workers():
        problems.append(f"planning.enabled with algorithm {cfg.algorithm.name} trained by gradient workers: there is"
                        " no replay to plan from; allowed: an algorithm with a learner (dqn)")
    n_step = _field(cfg.algorithm, "n_step")
    if n_step not in (None, 1):
        problems.append(f"planning.enabled with algorithm.n_step={n_step}: the world model learns one-step dynamics"
                        " from the real table's transitions; allowed: algorithm.n_step=1")
    if cfg.learners > 1:
        problems.append(f"planning.enabled with learners={cfg.learners}: allowed: learners=1")
    return problems


def _field(section: Any, name: str) -> Any:
    return getattr(section, name, None) if name in type(section).model_fields else None
