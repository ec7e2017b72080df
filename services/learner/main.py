"""Entry point of the learner service (`rlfleet service learner`)."""

from __future__ import annotations

from common.config import Experiment
from common.runtime import ServiceArgs
from services.learner.learner import LearnerService


def build(cfg: Experiment, args: ServiceArgs) -> LearnerService:
    return LearnerService(cfg)
