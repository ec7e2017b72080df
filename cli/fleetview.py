"""Reading a running fleet through its /healthz and /metrics endpoints.

Used by the launcher's live view and progress CSV; works for any fleet whose
metrics URLs are known (local processes, inproc threads, containers).
"""

from __future__ import annotations

import csv
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live
from rich.table import Table


@dataclass
class Endpoint:
    healthy: bool = False
    health: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, float] = field(default_factory=dict)  # name{labels} summed over label sets


def fetch(url: str, timeout_s: float) -> tuple[int, bytes]:
    """GET ``url``: its status and body, an HTTP error status included (connection errors raise)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def scrape(base_url: str, health_only: bool = False, timeout_s: float = 2.0) -> Endpoint:
    """Health and metrics of one service; an unreachable one is unhealthy, not an error."""
    out = Endpoint()
    try:
        code, body = fetch(base_url + "/healthz", timeout_s)
        out.health = json.loads(body or b"{}")
        out.healthy = code == 200 and bool(out.health.get("ok"))
        if not health_only:
            _, text = fetch(base_url + "/metrics", timeout_s)
            for family in text_string_to_metric_families(text.decode()):
                for s in family.samples:
                    out.samples[s.name] = out.samples.get(s.name, 0.0) + s.value
    except (OSError, ValueError, http.client.HTTPException):  # e.g. IncompleteRead: it died mid-answer
        out.healthy = False
    return out


class HasUrl(Protocol):
    name: str
    label: str

    @property
    def url(self) -> str: ...


@dataclass
class Scrape:
    """The fleet's key figures at one moment."""

    elapsed: float = 0.0
    env_steps: float = 0.0
    updates: float = 0.0
    replay_size: float = 0.0
    version: float = -1.0
    eval_return: float | None = None
    eval_version: float | None = None
    steps_per_s: float = 0.0
    updates_per_s: float = 0.0
    actor_staleness: float = 0.0  # mean over actors of rlfleet_weights_staleness
    healthy: dict[str, bool] = field(default_factory=dict)


def collect(members: Iterable[HasUrl], elapsed: float) -> Scrape:
    snap = Scrape(elapsed=elapsed)
    actors = 0
    for m in members:
        ep = scrape(m.url)
        snap.healthy[m.label] = ep.healthy
        s = ep.samples
        if m.name == "actor":
            snap.env_steps += s.get("rlfleet_env_steps_total", 0.0)
            snap.actor_staleness += s.get("rlfleet_weights_staleness", 0.0)
            actors += 1
        elif m.name == "learner":
            # several learners take each update together (one all-reduce): count it once
            snap.updates = max(snap.updates, s.get("rlfleet_learner_updates_total", 0.0))
            snap.version = max(snap.version, s.get("rlfleet_learner_version", -1.0))
        elif m.name == "replay":
            snap.replay_size += s.get("rlfleet_replay_size", 0.0)
        elif m.name == "paramserver" and s.get("rlfleet_paramserver_gradients_applied_total"):
            # gradient workers (A3C): every push reaches every shard; applied pushes are the updates
            snap.updates = max(snap.updates, s["rlfleet_paramserver_gradients_applied_total"])
            snap.version = max(snap.version, s.get("rlfleet_paramserver_version", -1.0))
        elif m.name == "evaluator" and s.get("rlfleet_evaluations_total", 0.0) > 0:
            snap.eval_return = s.get("rlfleet_eval_return")
            snap.eval_version = s.get("rlfleet_eval_version")
    snap.actor_staleness /= max(1, actors)
    return snap


def last_progress(csv_path: Path) -> Scrape | None:
    """A run's last progress.csv row (wall seconds, env steps) and its best evaluation; None without rows."""
    try:
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    if not rows:
        return None
    returns = [float(r["eval_return"]) for r in rows if r.get("eval_return")]
    try:
        return Scrape(elapsed=float(rows[-1]["wall_s"]), env_steps=float(rows[-1]["env_steps"]),
                      eval_return=max(returns) if returns else None)
    except (KeyError, ValueError):
        return None


CSV_FIELDS = ("wall_s", "env_steps", "updates", "eval_return", "eval_version", "replay_size", "weights_version",
              "env_steps_per_s", "updates_per_s", "actor_staleness")


class FleetView:
    """Live console table (on a terminal) or a plain line every few seconds, plus progress.csv."""

    def __init__(self, members: list[Any], csv_path: Path, live: bool, lines: bool = True,
                 before: Scrape | None = None) -> None:
        """``live``: the console table (on a terminal); else, with ``lines``, a plain line every few seconds.
        ``before``: a resumed run's last figures (:func:`last_progress`): its env steps and wall seconds
        are added to this fleet's, its best return kept, and progress.csv goes on after its rows."""
        self.members = members
        self.lines = lines
        self.before = before or Scrape()
        self.best_return: float | None = self.before.eval_return
        self._prev: Scrape | None = None
        resumed = before is not None and csv_path.is_file()
        self._csv_file = open(csv_path, "a" if resumed else "w", newline="")  # noqa: SIM115 (closed in close())
        self._csv = csv.writer(self._csv_file)
        if not resumed:
            self._csv.writerow(CSV_FIELDS)
        self._console = Console()
        self._live = Live(console=self._console, refresh_per_second=2) if live else None
        if self._live:
            self._live.start()
        self._last_print = 0.0

    def update(self, elapsed: float) -> Scrape:
        snap = collect(self.members, elapsed + self.before.elapsed)
        snap.env_steps += self.before.env_steps
        prev = self._prev
        if prev is not None and snap.elapsed > prev.elapsed:
            dt = snap.elapsed - prev.elapsed
            snap.steps_per_s = max(0.0, snap.env_steps - prev.env_steps) / dt
            snap.updates_per_s = max(0.0, snap.updates - prev.updates) / dt
        if snap.eval_return is not None:
            self.best_return = max(self.best_return or snap.eval_return, snap.eval_return)
        self._prev = snap
        self._csv.writerow([
            f"{snap.elapsed:.2f}", int(snap.env_steps), int(snap.updates),
            "" if snap.eval_return is None else f"{snap.eval_return:.3f}",
            "" if snap.eval_version is None else int(snap.eval_version),
            int(snap.replay_size), int(snap.version), f"{snap.steps_per_s:.1f}", f"{snap.updates_per_s:.1f}",
            f"{snap.actor_staleness:.2f}",
        ])
        self._csv_file.flush()
        self._show(snap)
        return snap

    def _show(self, snap: Scrape) -> None:
        ret = "-" if snap.eval_return is None else f"{snap.eval_return:.1f} (v{snap.eval_version:.0f})"
        if self._live:
            table = Table(title="rlfleet", show_header=True)
            for col in ("elapsed", "env steps/s", "updates/s", "replay size", "weights", "eval return", "healthy"):
                table.add_column(col, justify="right")
            ok = sum(snap.healthy.values())
            table.add_row(f"{snap.elapsed:.0f} s", f"{snap.steps_per_s:.0f}", f"{snap.updates_per_s:.0f}",
                          f"{snap.replay_size:.0f}", f"v{snap.version:.0f}", ret, f"{ok}/{len(snap.healthy)}")
            self._live.update(table)
        elif self.lines and time.monotonic() - self._last_print >= 5.0:
            self._last_print = time.monotonic()
            print(f"[{snap.elapsed:5.0f} s] steps {snap.env_steps:.0f} ({snap.steps_per_s:.0f}/s)  "
                  f"updates {snap.updates:.0f} ({snap.updates_per_s:.0f}/s)  replay {snap.replay_size:.0f}  "
                  f"weights v{snap.version:.0f}  eval {ret}", flush=True)

    def close(self) -> None:
        if self._live:
            self._live.stop()
        self._csv_file.close()
