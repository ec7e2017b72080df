"""Reading a run directory (what `rlfleet up` leaves behind) into arrays and key figures.

A run directory holds ``config.yaml`` (resolved), ``progress.csv`` (one row a
second, from the fleet's /metrics), ``evaluations.csv`` (one row per
evaluation) and ``episodes/<actor>.csv``. This module is what ``rlfleet
report`` and the scaling benchmark read runs with; it only reads.

Clocks: progress.csv's ``wall_s`` counts from the moment the fleet was healthy
(the run clock). evaluations.csv stamps rows with Unix time; each evaluation is
put on the run clock by the first progress row that shows its version (the
launcher scrapes once a second, so placement is within a second), and its env
steps are the evaluator's own count where the row has one (evaluator.every_steps),
else interpolated from progress.csv.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml


class RunError(ValueError):
    """The directory is not a run, or lacks what was asked of it; the message says which."""


@dataclass
class Run:
    path: Path
    actors: int
    sync: str
    env_id: str
    name: str
    progress: dict[str, np.ndarray]
    evals: dict[str, np.ndarray] = field(default_factory=dict)  # wall_s, env_steps, version, mean, std

    @property
    def label(self) -> str:
        return f"{self.actors} actor{'s' if self.actors != 1 else ''}, {self.sync}"

    @property
    def has_evals(self) -> bool:
        return bool(self.evals) and len(self.evals["mean"]) > 0


@dataclass
class Summary:
    """A run's figures, as report.md prints them."""

    run: str
    actors: int
    sync: str
    target: float | None
    evaluations: int
    final_return: float
    best_return: float
    seconds: float  # wall_s of the last progress row
    env_steps: int  # env steps of the last progress row
    seconds_to_target: float | None  # None: not reached
    env_steps_to_target: int | None
    steps_per_s: float  # mean over the progress.csv span
    updates_per_s: float

    @property
    def reached(self) -> bool:
        return self.seconds_to_target is not None


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    """Columns as float arrays; empty cells are NaN."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return {}
    header, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(header):
        col = []
        for r in body:
            try:
                col.append(float(r[i]) if r[i] != "" else math.nan)
            except ValueError:
                col.append(math.nan)
        out[name] = np.asarray(col, np.float64)
    return out


def load_run(path: str | Path, require_evals: bool = True) -> Run:
    """Read one run directory; RunError says what is missing."""
    p = Path(path)
    if not p.is_dir():
        raise RunError(f"{p}: no such directory")
    cfg_path, progress_path = p / "config.yaml", p / "progress.csv"
    if not cfg_path.is_file() or not progress_path.is_file():
        raise RunError(f"{p} is not a run directory (no config.yaml and progress.csv; `rlfleet up` makes them)")
    try:
        cfg: dict[str, Any] = yaml.safe_load(cfg_path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RunError(f"{cfg_path}: not valid YAML ({exc})") from None
    progress = _read_csv(progress_path)
    if not progress or "wall_s" not in progress or len(progress["wall_s"]) == 0:
        raise RunError(f"{progress_path} has no rows yet: the run had not started when it stopped")
    run = Run(
        path=p.resolve(),
        actors=int(cfg.get("actor", {}).get("count", 0)),
        sync=str(cfg.get("sync", "?")),
        env_id=str(cfg.get("env", {}).get("id", "?")),
        name=p.resolve().name,
        progress=progress,
    )
    evals_path = p / "evaluations.csv"
    if evals_path.is_file():
        run.evals = place_evaluations(_read_csv(evals_path), progress)
    if require_evals and not run.has_evals:
        raise RunError(f"{p}: no evaluations yet (evaluations.csv is missing or empty); "
                       "is the evaluator enabled (evaluator.enabled) and did the run last past its first one?")
    return run


def place_evaluations(rows: dict[str, np.ndarray], progress: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """evaluations.csv rows on the run clock, with env steps interpolated from progress.csv."""
    if not rows or len(rows.get("mean_return", ())) == 0:
        return {}
    wall, steps = progress["wall_s"], progress["env_steps"]
    seen = progress.get("eval_version", np.full(len(wall), math.nan))
    first_seen: dict[int, float] = {}
    for t, v in zip(wall, seen, strict=True):
        if not math.isnan(v):
            first_seen.setdefault(int(v), float(t))
    # A scrape sees an evaluation at or after it was written: each match bounds the
    # run clock's Unix start from below; the tightest bound is the largest.
    # Only a version's first row counts: the evaluator may score a version again, later.
    bounds, counted = [], set()
    for u, v in zip(rows["wall_time"], rows["version"], strict=True):
        if int(v) in first_seen and int(v) not in counted:
            counted.add(int(v))
            bounds.append(u - first_seen[int(v)])
    if bounds:
        start = max(bounds)
    else:  # no scrape saw one: put the last evaluation at the end of progress.csv
        start = float(rows["wall_time"][-1] - wall[-1])
    t_run = rows["wall_time"] - start
    env_steps = np.interp(t_run, wall, steps)
    if "env_steps" in rows:  # the evaluator's own count, where it recorded one (evaluator.every_steps)
        env_steps = np.where(np.isnan(rows["env_steps"]), env_steps, rows["env_steps"])
    return {
        "wall_s": t_run,
        "env_steps": env_steps,
        "version": rows["version"],
        "mean": rows["mean_return"],
        "std": rows.get("std_return", np.zeros_like(rows["mean_return"])),
    }


def default_target(env_id: str) -> float | None:
    """The env's reward_threshold from its gymnasium spec (CartPole-v1: 475), if it has one."""
    try:
        import gymnasium as gym

        threshold = gym.spec(env_id).reward_threshold
    except Exception:  # unknown or custom env: no default target
        return None
    return None if threshold is None else float(threshold)


def _rate(values: np.ndarray, wall: np.ndarray) -> float:
    span = float(wall[-1] - wall[0])
    return float(values[-1] - values[0]) / span if span > 0 else 0.0


def summarize(run: Run, target: float | None) -> Summary:
    """Key figures. Time and env steps to target: the first progress.csv row whose eval
    return reaches the target (what the launcher stops on). Rates: mean over progress.csv."""
    p = run.progress
    wall, steps = p["wall_s"], p["env_steps"]
    to_s: float | None = None
    to_steps: int | None = None
    if target is not None:
        hits = np.flatnonzero(np.nan_to_num(p.get("eval_return", np.full(len(wall), np.nan)), nan=-np.inf) >= target)
        if len(hits):
            to_s, to_steps = float(wall[hits[0]]), int(steps[hits[0]])
    means = run.evals["mean"] if run.has_evals else np.array([math.nan])
    return Summary(
        run=run.name, actors=run.actors, sync=run.sync, target=target,
        evaluations=len(run.evals["mean"]) if run.has_evals else 0,
        final_return=float(means[-1]), best_return=float(np.nanmax(means)),
        seconds=float(wall[-1]), env_steps=int(steps[-1]),
        seconds_to_target=to_s, env_steps_to_target=to_steps,
        steps_per_s=_rate(steps, wall), updates_per_s=_rate(p.get("updates", np.zeros_like(wall)), wall),
    )


def staleness(run: Run) -> dict[str, np.ndarray]:
    """Weights staleness over time, in versions.

    ``evaluator``: learner's newest version minus the version of the last evaluation
    (progress.csv). ``actors``: mean over actors of rlfleet_weights_staleness (versions an
    actor jumped at its last sync), when progress.csv has the ``actor_staleness`` column.
    """
    p = run.progress
    out = {"wall_s": p["wall_s"], "evaluator": p["weights_version"] - p.get("eval_version", math.nan)}
    if "actor_staleness" in p:
        out["actors"] = p["actor_staleness"]
    return out


def weights_time_to_target(run: Run, target: float) -> tuple[float, int] | None:
    """(wall_s, env steps) when the learner published the first version that the evaluator
    later scored >= target: time to *produce* the policy, free of the evaluator's own delay
    (an evaluation of a good CartPole policy under step latency takes seconds)."""
    if not run.has_evals:
        return None
    good = np.flatnonzero(run.evals["mean"] >= target)
    if not len(good):
        return None
    version = float(np.min(run.evals["version"][good]))
    p = run.progress
    rows = np.flatnonzero(p["weights_version"] >= version)
    if not len(rows):
        return None
    return float(p["wall_s"][rows[0]]), int(p["env_steps"][rows[0]])
