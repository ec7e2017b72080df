"""Chaos, how long it takes: the fleet acts and learns again soon after a killed service answers again.

bench.fleet.faults measures the recovery (goal: the fleet's env steps/s back to 80% within 1 s of the
restarted service's /healthz answer; measured: within one 0.25 s scrape): the speed is the
benchmark's claim. This test polls a local fleet of processes (CartPole, two actors, replay with
``wal``) for the fleet going on, under a deadline, ``RESUME_S`` from that answer, generous for a
loaded machine yet below the request timeout a stuck client would wait out: it fails, for one,
when the learner does not ask again for the samples a killed replay held (it waits out its request
timeout, 35 s). Requests
lost with a killed paramserver or replay are rarer in a fleet (only those the old process had
read: ZeroMQ keeps what is sent while it is down and delivers it to the new one); their resends
are tested one by one (tests/unit/paramserver/test_paramserver_requests.py, tests/unit/replay/test_replay_client.py).

- replay: the actors step and the learner trains again (the actors resend their windows on the
  new connection, the learner asks again for the samples the old replay held);
- the paramserver: it holds the learner's version again (the learner's probe republishes), and
  the fleet steps and trains;
- the learner: it trains again from its checkpoint (its update count at least what it had at its
  last checkpoint before the kill) and the fleet steps;
- an actor: the restarted actor steps.

Async and barrier. Each service is down ``DOWN_S`` seconds, less than the registry's liveness
timeout, so in a barrier fleet the rounds wait for a killed actor and go on when it is back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.chaos_helpers import kill9, member, start_fleet
from harness.fleet_helpers import CONFIGS, wait_for
from rlfleet.cli.fleetview import scrape
from rlfleet.cli.launcher import Fleet
from rlfleet.services.learner.learner import checkpoint_path

pytestmark = pytest.mark.chaos

RESUME_S = 20.0  # generous on a loaded machine, below the 35 s a learner that never asks again would wait
DOWN_S = 2.0
STEPS = 256  # env steps the fleet must make (4 inserts of 64), updates the learner must do: 10
UPDATES = 10
SETS = ["replay.durability=wal", "learner.checkpoint_every_s=2", "paramserver.liveness_timeout_s=5",
        "evaluator.enabled=false"]
CONFIG = {"async": "cartpole-dqn.yaml", "barrier": "cartpole-dqn-barrier.yaml"}


def metric(fleet: Fleet, label: str, name: str) -> float:
    return scrape(member(fleet, label).url, timeout_s=0.5).samples.get(name, -1.0)


def fleet_steps(fleet: Fleet) -> float:
    """Env steps of every actor that answers (a killed one's new process counts from 0 again)."""
    return sum(max(0.0, metric(fleet, m.label, "rlfleet_env_steps_total")) for m in fleet.members
               if m.name == "actor")


def updates(fleet: Fleet) -> float:
    return metric(fleet, "learner", "rlfleet_learner_updates_total")


def kill_and_restart(fleet: Fleet, label: str) -> float:
    """kill -9, ``DOWN_S`` dead, restarted; returns when it answered /healthz again (monotonic)."""
    m = member(fleet, label)
    kill9(m)
    time.sleep(DOWN_S)
    fleet.restart(m)
    wait_for(lambda: scrape(m.url, timeout_s=0.5, health_only=True).healthy, 120, f"{label} to answer again",
             every_s=0.05)
    return time.monotonic()


def resumed_within(up: float, what: str, done: Callable[[], bool]) -> float:
    """Seconds from ``up`` until ``done()``; fails past ``RESUME_S`` (polled every 0.05 s)."""
    while not done():
        took = time.monotonic() - up
        assert took <= RESUME_S, f"{what}: not within {RESUME_S:g} s of the restarted service's health answer"
        time.sleep(0.05)
    return time.monotonic() - up


@pytest.mark.parametrize("sync", ["async", "barrier"])
def test_the_fleet_acts_and_learns_again_soon_after_a_restarted_service_answers(sync: str, tmp_path: Path) -> None:
    fleet, cfg = start_fleet(CONFIGS / CONFIG[sync], tmp_path, 2, SETS)
    took: dict[str, float] = {}
    try:
        wait_for(lambda: updates(fleet) >= 300, 180, "300 learner updates")

        up = kill_and_restart(fleet, "replay-0")
        steps, done = fleet_steps(fleet), updates(fleet)
        took["replay"] = resumed_within(
            up, "after replay's restart, the actors step and the learner trains",
            lambda: fleet_steps(fleet) >= steps + STEPS and updates(fleet) >= done + UPDATES)

        version = metric(fleet, "learner", "rlfleet_learner_version")
        up = kill_and_restart(fleet, "paramserver-0")
        steps, done = fleet_steps(fleet), updates(fleet)
        took["paramserver"] = resumed_within(
            up, f"after the paramserver's restart, it holds version {version:g} or newer, the fleet steps and trains",
            lambda: metric(fleet, "paramserver-0", "rlfleet_paramserver_version") >= version
            and fleet_steps(fleet) >= steps + STEPS and updates(fleet) >= done + UPDATES)

        # the learner, killed just after a checkpoint written once it had done ``floor`` updates
        ckpt = checkpoint_path(cfg)
        floor = updates(fleet)
        written = (ckpt.stat().st_ino, ckpt.stat().st_mtime_ns)
        wait_for(lambda: (ckpt.stat().st_ino, ckpt.stat().st_mtime_ns) != written, 60,
                 f"a learner checkpoint after {floor:g} updates", every_s=0.05)
        up = kill_and_restart(fleet, "learner")
        steps, done = fleet_steps(fleet), updates(fleet)
        assert done >= floor > 0, f"the restarted learner is at update {done:g}, its checkpoint had {floor:g} or more"
        took["learner"] = resumed_within(
            up, "after the learner's restart, it trains and the fleet steps",
            lambda: updates(fleet) >= done + UPDATES and fleet_steps(fleet) >= steps + STEPS)

        up = kill_and_restart(fleet, "actor-0")
        took["actor"] = resumed_within(up, "the restarted actor steps",
                                       lambda: metric(fleet, "actor-0", "rlfleet_env_steps_total") >= STEPS)
    finally:
        fleet.stop()
    print(f"{sync}: seconds from each restarted service's health answer until the fleet went on: "
          + ", ".join(f"{k} {v:.2f}" for k, v in took.items()))


def test_an_async_learner_trains_on_while_the_paramserver_is_down(tmp_path: Path) -> None:
    """A dead paramserver costs an async learner at most a short publish timeout (about a second for
    CartPole's weights), not ``network.timeout_s``: the actors act on the weights they hold and the
    learner learns from what they insert; the restarted paramserver gets the version back."""
    fleet, cfg = start_fleet(CONFIGS / CONFIG["async"], tmp_path, 2, SETS)
    try:
        wait_for(lambda: updates(fleet) >= 300, 180, "300 learner updates")
        m = member(fleet, "paramserver-0")
        kill9(m)
        done = updates(fleet)
        wait_for(lambda: updates(fleet) >= done + 3 * UPDATES, cfg.network.timeout_s - 2,
                 "learner updates while the paramserver is down")
        assert member(fleet, "learner").proc.poll() is None
        fleet.restart(m)  # the learner republishes within a second of its probe's answer
        wait_for(lambda: metric(fleet, "paramserver-0", "rlfleet_paramserver_version") >= 0, 60,
                 "the restarted paramserver holds a version again")
    finally:
        fleet.stop()
