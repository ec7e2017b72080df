"""Parallel Dyna-Q in compose: RLFLEET_CONFIG=./configs/cartpole-dynaq.yaml with --scale planner=2. The
modeler container trains and publishes the world model, both planners (ids of their own) insert imagined
transitions, and the learner samples them. Needs a Docker engine and the images, as
tests/containers/test_containers.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.docker_fleet import compose_project, fetch, healthz, metrics, wait_for

STARTUP_S = 300
DYNAQ_CONFIG = "./configs/cartpole-dynaq.yaml"
DYNAQ_ENV = {
    "RLFLEET_REPLAY__DURABILITY": "checkpoint",
    "RLFLEET_REPLAY__TABLES__0__MIN_SIZE": "300",
    "RLFLEET_REPLAY__TABLES__1__MIN_SIZE": "200",
    "RLFLEET_PLANNING__GATE": "0.3",
    "RLFLEET_EVALUATOR__EPISODES": "2",
}

pytestmark = pytest.mark.container


def imagined_sampled(learner: Any) -> float:
    """The learner's imagined items (rlfleet_learner_sampled_items_total{source="imagined"})."""
    for line in fetch(learner, "/metrics").splitlines():
        if line.startswith("rlfleet_learner_sampled_items_total{") and 'source="imagined"' in line:
            return float(line.rpartition(" ")[2])
    return 0.0


def test_compose_scales_planners_and_the_learner_samples_what_they_imagine(docker_client: Any,
                                                                           tmp_path: Path) -> None:
    with compose_project(docker_client, tmp_path, DYNAQ_ENV, DYNAQ_CONFIG, actors=1, scale={"planner": 2}) as proj:
        planners = wait_for(lambda: proj.containers("planner"), lambda c: len(c) == 2, STARTUP_S, "2 planners")
        wait_for(lambda: [metrics(c).get("rlfleet_planner_imagined_inserts_total", 0.0) for c in planners],
                 lambda inserts: all(n > 0 for n in inserts), STARTUP_S, "imagined inserts from both planners")
        assert len({healthz(c)["planner_id"] for c in planners}) == 2  # one id each, though both are index 0
        modeler = proj.one("modeler")
        assert healthz(modeler)["gate_open"] and metrics(modeler)["rlfleet_modeler_publishes_total"] > 0
        wait_for(lambda: imagined_sampled(proj.one("learner")), lambda n: n > 0, STARTUP_S,
                 "the learner's first imagined batch")
