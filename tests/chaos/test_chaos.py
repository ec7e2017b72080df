"""Chaos: kill -9 each service in turn during a CartPole run, restart it, lose nothing.

For each protocol (async, barrier) a local fleet of processes (replay with
durability ``wal``, paramserver, learner, two actors, evaluator) trains
CartPole while an actor, the replay, the paramserver and the learner are
killed with SIGKILL one after the other and restarted with the launcher's own
command. Checks:

- every insert an actor logged as acked (actor.acked_log) is in replay's
  write-ahead log afterwards, with its item count (by (actor id, seq)), and a
  restarted replay reloads every item it had stored;
- the learner's update counter never goes backwards while the learner lives,
  and a restarted learner continues from its checkpoint (not from 0); the
  weights version never goes backwards;
- barrier: with an actor dead, the next rounds complete within the liveness
  timeout (plus one round), i.e. the barrier does not wait for the dead actor;
- the fleet resumes after each restart, and the run still reaches its target.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from harness.chaos_helpers import Watcher, acked, kill9, lost, member, restart, start_fleet, stored
from harness.fleet_helpers import CONFIGS, read_csv, wait_for
from rlfleet.cli.fleetview import scrape

pytestmark = pytest.mark.chaos

LIVENESS_S = 4.0
CHECKPOINT_S = 2.0
MAX_UNACKED_BYTES = 16384  # a few inserts: the bound, not the count (actor.max_unacked), is what binds
TARGET = 400.0  # greedy mean over 10 episodes: a broken learner or lost data does not get there
SETS = [
    "replay.durability=wal",
    "replay.checkpoint_every_s=3600",  # no snapshot: the log keeps every insert for the check
    "actor.acked_log=true",
    f"actor.max_unacked_bytes={MAX_UNACKED_BYTES}",
    f"learner.checkpoint_every_s={CHECKPOINT_S}",
    f"paramserver.liveness_timeout_s={LIVENESS_S}",
    "evaluator.every_steps=4000",
]
CONFIG = {"async": "cartpole-dqn.yaml", "barrier": "cartpole-dqn-barrier.yaml"}


def progressed(watch: Watcher, after: float, by: float) -> bool:
    last = watch.last()
    return last is not None and last.updates >= after + by


@pytest.mark.parametrize("sync", ["barrier", "async"])
def test_kill_every_service_in_turn(sync: str, tmp_path: Path) -> None:
    fleet, cfg = start_fleet(CONFIGS / CONFIG[sync], tmp_path, 2, SETS)
    run_dir = fleet.run_dir
    learner = member(fleet, "learner")
    watch = Watcher(lambda: learner.url).start()
    learner_restarts: list[tuple[float, float]] = []  # (kill time, restart time)
    try:
        wait_for(lambda: progressed(watch, 0, 300), 180, "300 learner updates")

        # -- an actor: the fleet goes on without it, the barrier stops waiting for it ---------------
        actor = member(fleet, "actor-0")
        registry = member(fleet, "paramserver-0")
        live = scrape(registry.url, health_only=True).health["live_actors"]
        v0 = watch.samples[-1].version
        kill9(actor)
        killed = time.monotonic()
        if sync == "barrier":
            # A wait the actor parked before it died may let one round through; the next ones need
            # the registry to drop it, which the liveness timeout bounds: the rounds go on (polled
            # under a generous deadline) because the registry dropped it, not because it waited less
            wait_for(lambda: watch.samples[-1].version >= v0 + 3, LIVENESS_S + 90, "rounds without the dead actor")
            took = time.monotonic() - killed
            print(f"barrier: 3 rounds {took:.1f} s after an actor died (liveness timeout {LIVENESS_S:g} s)")
            assert scrape(registry.url, health_only=True).health["live_actors"] == live - 1, \
                "the rounds went on while the registry still counted the dead actor"
        else:
            at = watch.samples[-1].updates
            wait_for(lambda: progressed(watch, at, 200), 60, "updates with one actor dead")
        restart(fleet, actor)
        steps = scrape(actor.url).samples.get("rlfleet_env_steps_total", 0.0)
        wait_for(lambda: scrape(actor.url).samples.get("rlfleet_env_steps_total", 0.0) > steps + 500, 90,
                 "the restarted actor to act")

        # -- the replay (wal): nothing it acked is lost ------------------------------------------------
        replay = member(fleet, "replay-0")
        kill9(replay)
        before = acked(run_dir)
        held = stored(cfg)
        assert before and not lost(before, held), f"acked but not in the log: {sorted(lost(before, held))[:5]}"
        time.sleep(1.5)
        for label in ("actor-0", "actor-1"):  # alive, blocked on a full window of bounded size
            a = member(fleet, label)
            first = scrape(a.url)
            time.sleep(1.5)
            again = scrape(a.url)
            assert again.healthy, f"{label} died without replay"
            assert again.samples["rlfleet_actor_unacked_bytes"] <= MAX_UNACKED_BYTES, again.samples
            if sync == "async":  # it blocks (barrier actors may be waiting for a version instead)
                assert again.samples["rlfleet_actor_unacked_bytes"] > 0
                assert again.samples["rlfleet_env_steps_total"] == first.samples["rlfleet_env_steps_total"]
        restart(fleet, replay)
        restored = int(re.findall(r"restored (\d+) items", (run_dir / "logs" / "replay-0.log").read_text())[-1])
        assert restored == sum(held.values()), (restored, sum(held.values()))
        at = watch.samples[-1].updates
        wait_for(lambda: progressed(watch, at, 200), 120, "the learner to train again after replay came back")

        # -- the paramserver (and an actor with it): actors act on what they hold, re-register, and the
        # learner republishes its version at once. (Without that, a barrier deadlocks here: the
        # restarted actor waits for any version, the learner for the round's barrier.)
        ps, other = member(fleet, "paramserver-0"), member(fleet, "actor-1")
        v_before = watch.samples[-1].version
        steps = scrape(actor.url).samples["rlfleet_env_steps_total"]
        kill9(ps)
        kill9(other)
        if sync == "async":  # actor-0 acts on the weights it holds
            wait_for(lambda: scrape(actor.url).samples["rlfleet_env_steps_total"] > steps + 400, 30,
                     "actor-0 to act without the paramserver")
        time.sleep(2)
        restart(fleet, ps)
        restart(fleet, other)
        wait_for(lambda: scrape(ps.url).samples.get("rlfleet_paramserver_version", -1) >= v_before, 60,
                 "the restarted paramserver to get current weights from the learner")
        wait_for(lambda: scrape(ps.url).samples.get("rlfleet_paramserver_live_actors", 0) >= 2, 60,
                 "both actors to re-register")
        wait_for(lambda: scrape(other.url).samples.get("rlfleet_env_steps_total", 0) > 500, 60,
                 "the restarted actor to act")
        at = watch.samples[-1].updates
        wait_for(lambda: progressed(watch, at, 200), 120, "training to go on after the paramserver restart")

        # -- the learner: resumes from its checkpoint and republishes ---------------------------------
        time.sleep(CHECKPOINT_S + 1)  # at least one checkpoint since the last restart
        learner_restarts.append((time.monotonic(), 0.0))  # before the kill: a sample can start after it
        kill9(learner)
        last_alive = watch.samples[-1]
        restart(fleet, learner)
        learner_restarts[-1] = (learner_restarts[-1][0], time.monotonic())
        log = (run_dir / "logs" / "learner.log").read_text()
        resumed = re.findall(r"resumed from .* at update (\d+), version (\d+)", log)
        assert resumed, log[-2000:]
        resumed_at = int(resumed[-1][0])
        assert resumed_at > 0
        wait_for(lambda: watch.samples[-1].version > last_alive.version, 60, "a newer version after the restart")
        wait_for(lambda: progressed(watch, resumed_at, 200), 120, "the learner to train after its restart")

        # -- and the run still learns -----------------------------------------------------------------
        def best() -> float:
            rows = read_csv(run_dir / "evaluations.csv")
            return max((float(r["mean_return"]) for r in rows), default=0.0)

        wait_for(lambda: best() >= TARGET, 300, f"an eval return of {TARGET}", every_s=1.0)

        final = acked(run_dir)
        held = stored(cfg)
        assert not lost(final, held), f"acked but not in replay: {sorted(lost(final, held))[:5]}"
        assert len(final) > len(before)
    finally:
        watch.stop()
        fleet.stop()

    # the update counter never goes backwards while the learner lives; a restart resumes its checkpoint
    s = watch.samples
    for a, b in zip(s, s[1:], strict=False):
        # a pair overlaps a restart if it straddles any moment from just before the kill to the end of
        # the restart (a sample is stamped when its scrape starts, so the old learner's are before the kill)
        across = any(a.t <= end and b.t >= start for start, end in learner_restarts)
        if across:
            assert b.updates >= resumed_at, (a, b, resumed_at)
        else:
            assert b.updates >= a.updates, (a, b)
        assert b.version >= a.version, (a, b)

