"""A local PPO fleet the test drives itself (cli.launcher's Fleet, real processes and sockets),
and a paramserver reader that records every weights version the learner publishes."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from harness.fleet_helpers import CONFIGS, wait_for
from rlfleet.cli.launcher import Fleet, Member, make_run_dir, plan
from rlfleet.common import config as config_mod
from rlfleet.common.clients.weights_reader import WeightsReader

Weights = dict[str, np.ndarray]


@contextmanager
def ppo_fleet(tmp_path: Path, actors: int, *sets: str, config: str = "cartpole-ppo.yaml",
              actors_before_learner: bool = False) -> Iterator[tuple[config_mod.Experiment, Fleet]]:
    """The fleet of ``config`` (evaluator off) with ``actors`` actors, started and healthy; stopped on exit.

    ``actors_before_learner``: the learner starts once every actor has registered, so round 0 (and
    every round after) has all of them: with the learner first, an actor that joins late misses
    the first rounds, which then hold fewer segments (correct, but not the same in every run).
    """
    cfg = config_mod.load(CONFIGS / config, environ={}, sets=["evaluator.enabled=false", *sets])
    run_dir = make_run_dir(cfg, str(tmp_path))
    cfg, members = plan(cfg, actors, run_dir, inproc=False)
    fleet = Fleet(cfg, members, run_dir, inproc=False)
    try:
        if actors_before_learner:
            learner = member(fleet, "learner")
            fleet.members = [m for m in members if m is not learner]
            fleet.start()  # the actors register, then wait for version 0: nobody acts before the learner
            live = 'rlfleet_paramserver_live_actors{service="paramserver",shard="0"}'
            wait_for(lambda: samples(fleet, "paramserver-0").get(live) == actors, 120, f"{actors} actors registered")
            fleet.members = members
            learner.log_path = run_dir / "logs" / "learner.log"
            fleet._start_process(learner)  # the launcher's own command for it
        else:
            fleet.start()
        fleet.wait_healthy(120)
        yield cfg, fleet
    finally:
        fleet.stop()


def member(fleet: Fleet, label: str) -> Member:
    return next(m for m in fleet.members if m.label == label)


def samples(fleet: Fleet, label: str) -> dict[str, float]:
    """The /metrics samples of one member by name and labels, e.g. 'x_total{reason="stale"}'."""
    with urllib.request.urlopen(member(fleet, label).url + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def follow_versions(cfg: config_mod.Experiment, last: int, timeout_s: float = 120) -> dict[int, Weights]:
    """Every version 0..``last`` as published (copies), long-polling the paramserver for each next one.

    In barrier mode version k + 1 cannot replace k + 2 before every actor has acted a whole round
    on it, so a reader that asks again as soon as it has k + 1 sees every version; a version
    that was skipped anyway is missing from the result (the caller says what it needed).
    """
    reader = WeightsReader(cfg.network.paramserver, "weights-follower", timeout_s=10.0, shm=False)
    seen: dict[int, Weights] = {}
    deadline = time.monotonic() + timeout_s
    want = 0
    try:
        while want <= last:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:.0f} s at version {want - 1} of {last}")
            got = reader.wait(want, timeout_s=1.0)
            if got is None:
                continue
            version, arrays = got
            seen[version] = {name: np.array(a, copy=True) for name, a in arrays.items()}
            want = version + 1
    finally:
        reader.close()
    return seen
