"""Entry point of the actor and evaluator services (`rlfleet service actor|evaluator`)."""

from __future__ import annotations

import os
import socket

from rlfleet.common.config import Experiment
from rlfleet.common.runtime import ServiceArgs


def build(cfg: Experiment, args: ServiceArgs):  # type: ignore[no-untyped-def]
    # A stable id survives a restart on the same host: the registry then gives it back its index.
    actor_id = args.actor_id or f"{args.name}-{socket.gethostname()}-{os.getpid()}"
    if args.name == "evaluator":
        from rlfleet.services.actor.evaluator import EvaluatorService

        return EvaluatorService(cfg, actor_id)
    if cfg.algorithm.trains_with_workers():  # A3C, HogWild DQN: no replay, no learner
        from rlfleet.services.actor.worker import WorkerService

        return WorkerService(cfg, actor_id)
    from rlfleet.services.actor.actor import ActorService

    return ActorService(cfg, actor_id)
