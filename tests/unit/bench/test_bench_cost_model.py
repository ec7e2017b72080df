"""bench.fleet.cost_model's arithmetic: the lockstep term of several learner ranks and which bound binds.

Costs are made up here; the bench's own run (real fleets) is in docs/cost_model.md.
"""

from __future__ import annotations

import pytest

from bench.fleet.cost_model import lockstep_seconds, predict

COSTS = {"update_256": 1.0e-3, "update_128": 0.7e-3, "learner_io": 0.0, "overhead": 0.5e-3,
         "allreduce_fleet": 1.0e-3, "actor_wall": 0.4e-3, "actor_wall_2ms": 2.2e-3, "actor_step": 0.04e-3,
         "replay_step": 0.03e-3, "replay_update": 0.5e-3, "ps_step": 0.02e-3, "ps_update": 0.0,
         "learner_busy": 1.0}


def test_other_work_that_fits_on_spare_cores_costs_the_ranks_nothing() -> None:
    assert lockstep_seconds(2e-3, 1e-3, spare=1.0) == pytest.approx(2e-3)


def test_other_work_without_a_spare_core_stalls_every_rank() -> None:
    # two ranks on two cores: each unit of other work adds to every update
    assert lockstep_seconds(2e-3, 1.5e-3, spare=0.0) == pytest.approx(3.5e-3)
    # more ranks than cores is no better than none spare
    assert lockstep_seconds(2e-3, 1.5e-3, spare=-1.0) == pytest.approx(3.5e-3)


def test_the_lockstep_solution_satisfies_its_equation() -> None:
    rank, other, spare = 2e-3, 5e-3, 1.0
    t = lockstep_seconds(rank, other, spare)
    assert t == pytest.approx(rank + max(0.0, other - spare * t))
    assert t > rank


def test_one_learner_has_no_lockstep_bound_and_two_on_two_cores_are_held_by_it() -> None:
    one = predict(COSTS, actors=2, learners=1, latency=0.0, k=32, batch=256, cores=2.0)
    assert "lockstep" not in one["bounds"]
    two = predict(COSTS, actors=2, learners=2, latency=0.0, k=32, batch=256, cores=2.0)
    assert two["binds"] == "lockstep"
    rank = COSTS["update_128"] + COSTS["overhead"] + COSTS["allreduce_fleet"]
    other = 8 * (COSTS["actor_step"] + COSTS["replay_step"] + COSTS["ps_step"]) + 2 * COSTS["replay_update"]
    assert two["updates_per_s"] == pytest.approx(1.0 / (rank + other))
    # the same two ranks with hosts of their own are held by their own work only
    apart = predict(COSTS, actors=2, learners=2, latency=0.0, k=32, batch=256, cores=64.0)
    assert apart["updates_per_s"] == pytest.approx(1.0 / rank)


def test_actors_bind_when_they_are_slow() -> None:
    p = predict(COSTS, actors=1, learners=1, latency=0.002, k=16, batch=256, cores=2.0)
    assert p["binds"] == "actors"
    assert p["env_steps_per_s"] == pytest.approx(1 / COSTS["actor_wall_2ms"])
