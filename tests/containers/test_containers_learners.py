"""Two data-parallel learner containers (RLFLEET_LEARNERS=2: --scale learner=2 in compose, 2 replicas
in a Swarm stack): they find each other through the service's DNS name (the lowest address hosts the
rendezvous), form a gloo group as ranks 0 and 1, and train together: both take updates, rank 0
publishes versions. Needs a Docker engine and the images, as tests/containers/test_containers.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.docker_fleet import (
    SERVICES,
    SHORT_ENV,
    ComposeProject,
    SwarmStack,
    compose_project,
    healthz,
    metrics,
    swarm_stack,
    wait_for,
)

STARTUP_S = 300

pytestmark = pytest.mark.container


def check_two_learners_train(fleet: ComposeProject | SwarmStack) -> None:
    learners = wait_for(lambda: fleet.containers("learner"), lambda c: len(c) == 2, STARTUP_S, "2 learners")
    ranks = wait_for(lambda: sorted(healthz(c).get("rank", -1) for c in learners), lambda r: r == [0, 1],
                     STARTUP_S, "ranks 0 and 1, agreed at start")
    assert all(healthz(c)["learners"] == 2 for c in learners), ranks
    first = [metrics(c).get("rlfleet_learner_updates_total", 0.0) for c in learners]

    def together(ms: list[dict[str, float]]) -> bool:
        return (all(m.get("rlfleet_learner_updates_total", 0.0) > f + 50 for m, f in zip(ms, first, strict=True))
                and max(m.get("rlfleet_learner_version", -1.0) for m in ms) > 2
                and all(m.get("rlfleet_learner_world_size", 0.0) == 2 for m in ms))

    wait_for(lambda: [metrics(c) for c in learners], together, STARTUP_S,
             "both learners training together, versions published")


def test_compose_with_two_learner_containers_trains(docker_client: Any, tmp_path: Path) -> None:
    with compose_project(docker_client, tmp_path, {**SHORT_ENV, "RLFLEET_LEARNERS": "2"}, scale={"learner": 2},
                         services=[s for s in SERVICES if s != "evaluator"]) as proj:
        check_two_learners_train(proj)


def test_swarm_stack_with_two_learner_replicas_trains(docker_client: Any, tmp_path: Path) -> None:
    with swarm_stack(docker_client, tmp_path, {**SHORT_ENV, "RLFLEET_LEARNERS": "2"}, 2) as stack:
        check_two_learners_train(stack)
