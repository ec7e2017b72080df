"""Faults: how long the fleet takes to recover from a kill -9 of each service, and what it loses.

    .venv/bin/python -m bench.fleet.faults [--sync async|barrier] [--down S]

A local fleet of processes (CartPole, Ape-X DQN, two actors, replay with
durability ``wal``, no evaluator) trains; once its env steps/s have settled,
each service in turn (an actor, the replay, the paramserver, the learner) is
killed with SIGKILL, left dead for ``--down`` seconds and restarted with the
launcher's own command. For each:

- ``resumed_after_up_s``: seconds from the restarted service's first /healthz answer to the first
  scrape (every 0.25 s) at which env steps had been made since the outage: the fleet's, and for a
  killed actor its own (its new process counts from 0). It does not depend on the machine's load
  staying what it was before the kill (the machine may be shared): a stall shows here, a fleet
  slowed by other processes does not;
- ``recovery_after_up_s``: seconds from that answer until the fleet's env steps/s (summed over the
  actors) is back: the start of the first 1 s stretch at >= 80% of the reference, the fleet's rate
  over the 10 s before the kill, and not before it resumed (so about 0 when it never fell below,
  e.g. an actor of two, once the restarted actor steps);
- ``recovery_s``: seconds from the kill to that same moment; ``restart_s``: of which seconds until
  the restarted process answered /healthz, after the ``--down`` seconds; ``lowest_while_down``:
  the lowest 1 s env steps/s between the kill and that answer, as a fraction of the reference
  (how hard the kill hit);
- ``acked_lost``: transitions an actor was told were stored (its acked log)
  that replay's write-ahead log does not hold. Must be 0.

The cost of ``wal`` durability, measured in the same run: acked insert
throughput of 2 writer processes (12,000 batches of 64 CartPole transitions)
into a replay with ``wal`` and into one with ``memory`` (bench.wire.replay_ingest's
case), three times each, alternated; ``ratio`` = median wal / median memory.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from bench.wire.replay_ingest import run_case
from harness.chaos_helpers import acked, kill9, lost, member, start_fleet, stored, wait_for
from harness.fleet_helpers import CONFIGS
from rlfleet.cli.fleetview import scrape
from rlfleet.cli.launcher import Fleet

CONFIG = {"async": "cartpole-dqn.yaml", "barrier": "cartpole-dqn-barrier.yaml"}
SETS = ["replay.durability=wal", "replay.checkpoint_every_s=3600", "actor.acked_log=true",
        "evaluator.enabled=false", "learner.checkpoint_every_s=5", "paramserver.liveness_timeout_s=5"]
KILLED = ("actor-0", "replay-0", "paramserver-0", "learner")


class Rate:
    """Fleet env steps/s from the actors' counters, scraped every 0.5 s."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.last: dict[str, float] = {}  # per actor: its counter (a restarted actor starts again at 0)
        self.total = 0.0
        self.points: deque[tuple[float, float]] = deque(maxlen=400)
        # per point, each actor's own counter as scraped then (absent: it did not answer)
        self.own: deque[tuple[float, dict[str, float]]] = deque(maxlen=400)

    def sample(self) -> None:
        own: dict[str, float] = {}
        for m in self.fleet.members:
            if m.name != "actor":
                continue
            now = scrape(m.url, timeout_s=0.5).samples.get("rlfleet_env_steps_total")
            if now is None:
                continue
            before = self.last.get(m.label, 0.0)
            self.total += now - before if now >= before else now
            self.last[m.label] = now
            own[m.label] = now
        t = time.monotonic()
        self.points.append((t, self.total))
        self.own.append((t, own))

    def over(self, seconds: float) -> float:
        now = self.points[-1][0]
        old = [p for p in self.points if p[0] >= now - seconds]
        if len(old) < 2 or old[-1][0] - old[0][0] <= 0:
            return 0.0
        return (old[-1][1] - old[0][1]) / (old[-1][0] - old[0][0])

    def run_for(self, seconds: float, every_s: float = 0.5) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.sample()
            time.sleep(every_s)

    def lowest(self, start: float, end: float, stretch_s: float = 1.0) -> float:
        """The lowest env steps/s over any ``stretch_s`` stretch between ``start`` and ``end``."""
        points = [p for p in self.points if start <= p[0] <= end]
        rates = []
        for i, (t0, n0) in enumerate(points):
            stop = next(((t, n) for t, n in points[i + 1:] if t - t0 >= stretch_s), None)
            if stop is not None:
                rates.append((stop[1] - n0) / (stop[0] - t0))
        return min(rates, default=float("nan"))

    def back_at(self, since: float, rate: float, stretch_s: float = 1.0) -> float | None:
        """The first time >= ``since`` that starts a ``stretch_s`` stretch averaging >= ``rate``."""
        points = [p for p in self.points if p[0] >= since]
        for i, (t0, n0) in enumerate(points):
            end = next(((t, n) for t, n in points[i + 1:] if t - t0 >= stretch_s), None)
            if end is not None and (end[1] - n0) / (end[0] - t0) >= rate:
                return t0
        return None

    def resumed_at(self, up: float, actor: str | None = None) -> float | None:
        """The first scrape at or after ``up`` showing env steps made since the outage.

        The fleet's: more than at the last scrape before ``up``; an actor's own (``actor``, a
        restarted one: its counter starts at 0): any.
        """
        if actor is not None:
            return next((t for t, own in self.own if t >= up and own.get(actor, 0.0) > 0), None)
        before = [n for t, n in self.points if t < up]
        if not before:
            return None
        return next((t for t, n in self.points if t >= up and n > before[-1]), None)


def kill_and_measure(fleet: Fleet, rate: Rate, label: str, down_s: float, limit_s: float) -> dict[str, Any]:
    rate.run_for(10)
    prior = rate.over(10)
    m = member(fleet, label)
    kill9(m)
    killed = time.monotonic()
    rate.run_for(down_s, every_s=0.25)
    fleet.restart(m)
    wait_for(lambda: scrape(m.url, health_only=True).healthy, 120, f"{label} to answer again", every_s=0.1)
    up = time.monotonic()
    rate.run_for(3, every_s=0.25)
    # when to stop watching: the 3 s window lags the fleet by up to 3 s, so the figures below are
    # read from the scrapes afterwards (the start of the first 1 s stretch back at 80%)
    while rate.over(3) < 0.8 * prior and time.monotonic() - killed < limit_s:
        rate.run_for(0.5, every_s=0.25)
    rate.run_for(1.5, every_s=0.25)  # a full stretch after the last point that may start one
    out = {"prior_steps_per_s": round(prior), **figures(rate, prior, killed, down_s, up, label),
           "down_s": down_s}
    back, resumed = out["recovery_after_up_s"], out["resumed_after_up_s"]
    print(f"{label}: prior {prior:.0f} env steps/s, back to 80% {'never' if back is None else f'{back:.2f} s'} "
          f"after its health answer (restart {out['restart_s']:.1f} s after {down_s:g} s down), stepping again "
          f"after {'never' if resumed is None else f'{resumed:.2f} s'}", flush=True)
    return out


def figures(rate: Rate, prior: float, killed: float, down_s: float, up: float, label: str) -> dict[str, Any]:
    """The figures of one kill from the scrapes (see the module's docstring): ``label`` was killed at
    ``killed``, restarted ``down_s`` later and answered /healthz again at ``up``; ``prior`` is the
    reference env steps/s."""
    at = rate.back_at(up, 0.8 * prior)
    resumed = rate.resumed_at(up, label if label.startswith("actor") else None)
    # not back before it steps again: a stretch that starts stalled still averages 80% when the
    # fleet runs faster after it than before the kill (the machine is shared)
    at = None if at is None or resumed is None else max(at, resumed)
    return {"recovery_s": None if at is None else round(at - killed, 1),
            "restart_s": round(up - killed - down_s, 1),
            "recovery_after_up_s": None if at is None else round(max(0.0, at - up), 2),
            "resumed_after_up_s": None if resumed is None else round(max(0.0, resumed - up), 2),
            "lowest_while_down": round(rate.lowest(killed, up) / prior, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sync", choices=sorted(CONFIG), default="async")
    ap.add_argument("--down", type=float, default=3.0, help="seconds a killed service stays dead")
    ap.add_argument("--limit", type=float, default=90.0, help="give up waiting for recovery after this long")
    a = ap.parse_args()
    out: dict[str, Any] = {"sync": a.sync, "down_s": a.down, "killed": {}}
    with tempfile.TemporaryDirectory(prefix="rlfleet-faults-") as tmp:
        fleet, cfg = start_fleet(CONFIGS / CONFIG[a.sync], Path(tmp), 2, SETS)
        try:
            rate = Rate(fleet)
            rate.run_for(20)  # past replay's min size and the first updates
            for label in KILLED:
                result = kill_and_measure(fleet, rate, label, a.down, a.limit)
                result["acked_lost"] = sum(lost(acked(fleet.run_dir), stored(cfg)).values())
                out["killed"][label.split("-")[0]] = result
            out["recovery_after_up_s"] = {name: r["recovery_after_up_s"] for name, r in out["killed"].items()}
            out["resumed_after_up_s"] = {name: r["resumed_after_up_s"] for name, r in out["killed"].items()}
            all_acked = acked(fleet.run_dir)
            out["acked_transitions"] = sum(all_acked.values())
            out["acked_lost"] = sum(lost(all_acked, stored(cfg)).values())
        finally:
            fleet.stop()
    # alternated and repeated: one case lasts about a second, and the machine is shared
    mems, wals = [], []
    for _ in range(3):
        mems.append(run_case("ours", 2, 64, 12_000))
        wals.append(run_case("wal", 2, 64, 12_000))
    mem, wal = float(np.median(mems)), float(np.median(wals))
    out["insert_transitions_per_s"] = {"memory": round(mem), "wal": round(wal)}
    out["ratio"] = round(wal / mem, 3)
    print(f"inserts, 2 writers, batch 64: memory {mem:,.0f}/s, wal {wal:,.0f}/s (medians of 3)", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
