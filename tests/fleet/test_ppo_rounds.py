"""PPO's rounds through a real fleet: DPPO (barrier) is repeatable to the bit, trains the weights the
serial runner trains, and trains on each segment once; APPO (async) drops and counts segments older
than max_staleness."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest

from harness.fleet_helpers import CONFIGS, wait_for
from harness.ppo_fleet_helpers import follow_versions, member, ppo_fleet, samples
from rlfleet.cli.serial import SerialRunner
from rlfleet.common import config as config_mod

pytestmark = pytest.mark.e2e

ROUNDS = 6


def barrier_weights(runs: Path, actors: int) -> dict[int, dict[str, np.ndarray]]:
    with ppo_fleet(runs, actors, "seed=5", actors_before_learner=True) as (cfg, _fleet):
        return follow_versions(cfg, ROUNDS)


def test_barrier_runs_give_the_same_weights(tmp_path: Path) -> None:
    """Two actors: their inserts reach the queue in an order the scheduler decides, which must not matter."""
    first = barrier_weights(tmp_path / "a", 2)
    second = barrier_weights(tmp_path / "b", 2)
    assert ROUNDS in first and ROUNDS in second, (sorted(first), sorted(second))
    for version in sorted(set(first) & set(second)):
        a, b = first[version], second[version]
        assert a.keys() == b.keys()
        for name in a:
            assert np.array_equal(a[name], b[name]), f"version {version}: {name} differs"
    # and learning happened: the weights moved between versions
    assert any(not np.array_equal(first[0][n], first[ROUNDS][n]) for n in first[0])



def test_the_fleet_trains_the_weights_the_serial_runner_trains(tmp_path: Path) -> None:
    """Same config and seed, two actors: the fleet's version k is the serial runner's version k, bit for
    bit. The sockets, processes and services add nothing to the algorithm (DPPO has no staleness)."""
    fleet = barrier_weights(tmp_path, 2)
    assert ROUNDS in fleet, sorted(fleet)
    cfg = config_mod.load(CONFIGS / "cartpole-ppo.yaml", environ={}, sets=["seed=5", "actor.count=2"])
    runner = SerialRunner(cfg)
    try:
        result = runner.run(max_env_steps=ROUNDS * 2 * cfg.env.num_envs * cfg.actor.steps_per_round)
        serial = runner.learner.weights()
    finally:
        runner.close()
    assert result.version == ROUNDS
    assert serial.keys() == fleet[ROUNDS].keys()
    for name in serial:
        assert np.array_equal(serial[name], fleet[ROUNDS][name]), f"version {ROUNDS}: {name} differs"


LEARNER = 'service="learner",shard="0"'
STALE = f'rlfleet_learner_items_dropped_total{{reason="stale",{LEARNER}}}'
TRAINED = f'rlfleet_learner_stat{{{LEARNER},stat="env_steps_trained"}}'
VERSION = f"rlfleet_learner_version{{{LEARNER}}}"
UPDATES = f"rlfleet_learner_updates_total{{{LEARNER}}}"
STALENESS = f"rlfleet_learner_item_staleness_count{{{LEARNER}}}"
FRESH = f'rlfleet_learner_item_staleness_bucket{{le="0.0",{LEARNER}}}'
TABLE = 'service="replay",shard="0",table="main"'


def test_barrier_trains_on_every_segment_once(tmp_path: Path) -> None:
    """Each round's learn call takes exactly that round's segments: after R rounds replay handed out
    R rounds of segments, the learner trained on exactly their env steps, none was stale."""
    with ppo_fleet(tmp_path, 2, actors_before_learner=True) as (cfg, fleet):
        wait_for(lambda: samples(fleet, "learner")[VERSION] >= 8, 120, "version 8")
        procs = [member(fleet, label).proc for label in ("actor-0", "actor-1")]
        for proc in procs:  # then no round can complete: the learner waits at the barrier
            assert proc is not None
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(30) for proc in procs if proc is not None] == [0, 0]
        learner = wait_for(stable_learner(fleet), 60, "the learner to settle")
        replay = samples(fleet, "replay-0")
    T, algo = cfg.algorithm.segment_length, cfg.algorithm
    round_segments = 2 * cfg.env.num_envs * cfg.actor.steps_per_round // T
    rounds = int(learner[VERSION])  # version 0 is the initial one: round k publishes k + 1
    sampled = replay[f"rlfleet_replay_samples_total{{{TABLE}}}"]
    inserted = replay[f"rlfleet_replay_inserts_total{{{TABLE}}}"]
    # Each round trained on all it sampled, and only on segments acted with that round's version
    # (a segment left over from an earlier round would show as staleness > 0): so on each once.
    assert learner[TRAINED] == sampled * T, (learner[TRAINED], sampled)
    assert learner[STALE] == 0 and learner[STALENESS] == learner[FRESH] == sampled, learner
    assert learner[UPDATES] == algo.epochs * sampled * T // algo.minibatch_size
    # Every round had both actors' segments (or, in the moment between the two SIGTERMs, one's);
    # what is left in the queue is at most the round the actors stopped in.
    assert rounds * round_segments // 2 <= sampled <= rounds * round_segments, (sampled, rounds)
    assert sampled >= (rounds - 3) * round_segments, (sampled, rounds)
    assert sampled <= inserted <= sampled + round_segments, (sampled, inserted)


def stable_learner(fleet: object, quiet_s: float = 1.5) -> object:
    """A predicate: the learner's samples once its version and updates held still for ``quiet_s``."""
    def settled() -> dict[str, float] | None:
        before = samples(fleet, "learner")  # type: ignore[arg-type]
        time.sleep(quiet_s)
        after = samples(fleet, "learner")  # type: ignore[arg-type]
        same = all(before[k] == after[k] for k in (VERSION, UPDATES, TRAINED))
        return after if same else None
    return settled


def test_async_drops_and_counts_stale_segments(tmp_path: Path) -> None:
    """APPO with max_staleness 0 and a version per learn call: two actors that poll once a segment
    act on versions the learner has already left behind; those segments are dropped and counted."""
    with ppo_fleet(tmp_path, 2, "sync=async", "algorithm.max_staleness=0", "learner.publish_every=1") as (_, fleet):
        learner = wait_for(lambda: (s := samples(fleet, "learner"))[STALE] >= 50 and s[TRAINED] > 0 and s,
                           120, "50 stale segments dropped")
    above_bound = learner[STALENESS] - learner[FRESH]  # observed staleness > 0 = max_staleness
    assert above_bound >= learner[STALE] >= 50
    assert learner[FRESH] > 0 and learner[TRAINED] > 0  # the fresh ones were trained on
