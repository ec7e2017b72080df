"""Entry point of the learner service (`rlfleet service learner`)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from common.config import Experiment
from common.metrics import ServiceMetrics
from common.runtime import ServiceArgs

log = logging.getLogger("rlfleet.learner")


class NoLearner:
    """The learner of an algorithm that trains through gradient workers: says so, then idles until
    stopped (compose and the Swarm stack start a learner whatever the algorithm, and restart one that
    exits; ``rlfleet up`` starts none)."""

    def __init__(self, cfg: Experiment) -> None:
        self.metrics = ServiceMetrics("learner", 0)
        self._stop = threading.Event()
        log.info("algorithm %s trains through gradient workers (the actors) and the paramserver's shard"
                 " optimizers: no learner needed; idle until stopped", cfg.algorithm.name)

    def run(self) -> None:
        self._stop.wait()

    def stop(self) -> None:
        self._stop.set()

    def health(self) -> dict[str, Any]:
        return {"ok": True, "learner": "not needed"}

    def close(self) -> None:
        pass


def build(cfg: Experiment, args: ServiceArgs) -> Any:
    if cfg.algorithm.trains_with_workers():
        return NoLearner(cfg)
    from services.learner.learner import LearnerService

    return LearnerService(cfg)
