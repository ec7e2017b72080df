"""Entry point of the learner service (`rlfleet service learner`)."""

from __future__ import annotations

from typing import Any

from rlfleet.common.config import Experiment
from rlfleet.common.runtime import IdleService, ServiceArgs


def build(cfg: Experiment, args: ServiceArgs) -> Any:
    if cfg.algorithm.trains_with_workers():
        return IdleService("learner", f"algorithm {cfg.algorithm.name} trains through gradient workers (the actors)"
                           " and the paramserver's shard optimizers: no learner needed")
    from rlfleet.services.learner.learner import LearnerService

    return LearnerService(cfg)
