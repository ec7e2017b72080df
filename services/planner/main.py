"""Entry point of the planner service (`rlfleet service planner`): parallel Dyna-Q's imagination."""

from __future__ import annotations

import os
import socket
from typing import Any

from rlfleet.common.config import Experiment
from rlfleet.common.runtime import IdleService, ServiceArgs


def build(cfg: Experiment, args: ServiceArgs) -> Any:
    if not cfg.planning.enabled:
        return IdleService("planner", "planning.enabled is false: no world model to plan with")
    from rlfleet.services.planner.planner import PlannerService

    planner_id = args.actor_id or f"planner-{socket.gethostname()}-{os.getpid()}"
    return PlannerService(cfg, planner_id, args.shard)
