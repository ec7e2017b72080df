"""Entry point of the modeler service (`rlfleet service modeler`): parallel Dyna-Q's world-model learner."""

from __future__ import annotations

from typing import Any

from rlfleet.common.config import Experiment
from rlfleet.common.runtime import IdleService, ServiceArgs


def build(cfg: Experiment, args: ServiceArgs) -> Any:
    if not cfg.planning.enabled:
        return IdleService("modeler", "planning.enabled is false: no world model to learn")
    from rlfleet.services.modeler.modeler import ModelerService

    return ModelerService(cfg)
