"""Killing and restarting members of a local fleet, and reading what they acked and stored.

Used by tests/chaos/test_chaos.py and bench/fleet/faults.py. The fleet is the launcher's
own (cli.launcher.Fleet, one process per service), so a killed member is
restarted with exactly the command the launcher used.
"""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harness.fleet_helpers import wait_for
from rlfleet.cli.fleetview import scrape
from rlfleet.cli.launcher import Fleet, Member, make_run_dir, plan
from rlfleet.common import config as config_mod
from rlfleet.common.config import Experiment
from rlfleet.services.replay.main import shard_dir
from rlfleet.services.replay.storage import read_log_file


def start_fleet(config: Path, runs: Path, actors: int, sets: Iterable[str]) -> tuple[Fleet, Experiment]:
    cfg = config_mod.load(config, environ={}, sets=list(sets))
    run_dir = make_run_dir(cfg, str(runs))
    cfg, members = plan(cfg, actors, run_dir, inproc=False)
    fleet = Fleet(cfg, members, run_dir, inproc=False)
    fleet.start()
    fleet.wait_healthy(180)
    return fleet, cfg


def member(fleet: Fleet, label: str) -> Member:
    return next(m for m in fleet.members if m.label == label)


def kill9(m: Member) -> None:
    assert m.proc is not None and m.proc.poll() is None, f"{m.label} is not running"
    m.proc.kill()
    m.proc.wait(10)


def restart(fleet: Fleet, m: Member, timeout_s: float = 120) -> None:
    fleet.restart(m)
    wait_for(lambda: scrape(m.url, health_only=True).healthy, timeout_s, f"{m.label} to be healthy again")


# -- what actors were told was stored, and what replay stored ---------------------------------------------

def acked(run_dir: Path) -> dict[tuple[str, int], int]:
    """(sender, seq) -> items of every insert an actor logged as acked (actor.acked_log)."""
    out: dict[tuple[str, int], int] = {}
    for path in sorted((run_dir / "acked").glob("*.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("items"):  # a row cut by the kill has no items yet: it was never complete
                    out[(row["sender"], int(row["seq"]))] = int(row["items"])
    return out


def stored(cfg: Experiment, shard: int = 0) -> dict[tuple[str, int], int]:
    """(sender, seq) -> items of every insert in replay's write-ahead log (durability wal).

    With replay.checkpoint_every_s longer than the run, no snapshot ever drops a
    segment before the final one, so the log holds every insert replay stored.
    """
    out: dict[tuple[str, int], int] = {}
    for path in sorted(shard_dir(cfg, shard).glob("wal-*.log")):
        for header, arrays in read_log_file(path):
            if header.get("op") == "insert":
                n = len(next(iter(a for k, a in arrays.items() if k != "__priority__")))
                out[(header["sender"], int(header["seq"]))] = n
    return out


def lost(acked_: dict[tuple[str, int], int], stored_: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Inserts acked to an actor that replay does not hold (or holds with other item counts)."""
    return {k: n for k, n in acked_.items() if stored_.get(k) != n}


# -- a background scrape of the learner ------------------------------------------------------------------

@dataclass
class Sample:
    t: float
    updates: float
    version: float


@dataclass
class Watcher:
    """Scrapes a member's metrics every ``every_s`` into a list of samples (while it answers)."""

    url_of: Callable[[], str]
    names: tuple[str, str] = ("rlfleet_learner_updates_total", "rlfleet_learner_version")
    every_s: float = 0.25
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Watcher:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            started = time.monotonic()  # when the scrape started: an answer comes from who was alive then
            got = scrape(self.url_of(), timeout_s=1.0)
            if got.healthy and self.names[0] in got.samples:
                self.samples.append(Sample(started, got.samples[self.names[0]],
                                           got.samples.get(self.names[1], -1.0)))

    def last(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
