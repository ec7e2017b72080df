"""Reading a run directory (what `rlfleet up` leaves behind) into arrays and key figures.

A run directory holds ``config.yaml`` (resolved), ``run.json`` (the target, the budgets and the
command's start: cli/runstart.py), ``progress.csv`` (one row a second, from the fleet's /metrics),
``evaluations.csv`` (one row per evaluation), ``episodes/<actor>.csv`` (one row per training episode)
and, once it stopped, ``ending.json``. This module is what ``rlfleet report`` and the scaling benchmark
read runs with; it only reads.

Clocks: every figure is on the run clock, seconds from the command's start (progress.csv's ``wall_s``).
evaluations.csv and the episode files stamp rows with Unix time, put on the run clock by run.json.
(A run from before run.json counted progress.csv from the moment the fleet was healthy; its
evaluations are placed by the first progress row that shows their version, within the 1 s scrape.)
Env steps are the fleet's: an evaluation's is the evaluator's own count where the row has one
(evaluator.every_steps), else, as for training episodes, :class:`FleetSteps` at that moment.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlfleet.cli import runstart
from rlfleet.cli.ending import EndingError
from rlfleet.cli.ending import read as read_ending


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
    config: str = "?"  # the experiment's name (config.yaml's name)
    algorithm: str = "?"
    target: float | None = None  # the eval return the run stopped on (--until-return), None: none given
    ready_s: float | None = None  # wall_s when every service was first healthy (run.json), None: not known
    episodes: dict[str, np.ndarray] = field(default_factory=dict)  # wall_s, env_steps, return: every actor's
    # training episodes, in time order; empty where the episode files carry no Unix time (older runs)

    @property
    def label(self) -> str:
        """'cartpole-dqn: dqn, async, 2 actors'."""
        return f"{self.config}: {self.algorithm}, {self.sync}, {self.actors} actor{'s' if self.actors != 1 else ''}"

    @property
    def has_evals(self) -> bool:
        return bool(self.evals) and len(self.evals["mean"]) > 0


@dataclass
class Summary:
    """A run's figures, as report.md prints them: all from the arrays the figures draw."""

    run: str
    config: str
    algorithm: str
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
    ready_s: float | None = None  # start-up: wall_s when the fleet was first healthy
    training_return: float | None = None  # mean of the last TRAINING_WINDOW training episodes

    @property
    def reached(self) -> bool:
        return self.seconds_to_target is not None


TRAINING_WINDOW = 20  # training episodes in a smoothed point (the actors' own episode_return gauge: 20)


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


def _own_target(p: Path, start: runstart.RunStart | None) -> float | None:
    """run.json's until_return; for a run from before run.json, ending.json's."""
    if start is not None:
        return start.until_return
    try:
        return read_ending(p).until_return
    except EndingError:
        return None


def load_run(path: str | Path, require_evals: bool = True) -> Run:
    """Read one run directory; RunError says what is missing."""
    p = Path(path)
    if not p.is_dir():
        raise RunError(f"{p}: no such directory")
    cfg_path, progress_path = p / "config.yaml", p / "progress.csv"
    if cfg_path.is_file() and (p / "result.json").is_file() and not progress_path.is_file():
        raise RunError(f"{p} is a serial run (rlfleet train --serial): it has evaluations.csv but no progress.csv, "
                       "which the report's figures and table need; `rlfleet up` runs have both")
    if not cfg_path.is_file() or not progress_path.is_file():
        raise RunError(f"{p} is not a run directory (no config.yaml and progress.csv; `rlfleet up` makes them)")
    try:
        cfg: dict[str, Any] = yaml.safe_load(cfg_path.read_text()) or {}
        start = runstart.read(p)
    except (yaml.YAMLError, runstart.RunStartError) as exc:
        raise RunError(f"{p}: {exc}") from None
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
        config=str(cfg.get("name", "?")),
        algorithm=str(cfg.get("algorithm", {}).get("name", "?")),
        target=_own_target(p, start),
        ready_s=None if start is None else start.ready_s,
    )
    evals_path = p / "evaluations.csv"
    rows = _read_csv(evals_path) if evals_path.is_file() else {}
    clock = start.wall_s if start is not None else _clock_from_scrapes(rows, progress)
    actors = actor_episodes(p / "episodes", clock)
    fleet_steps = FleetSteps(progress, actors)
    if rows:
        run.evals = place_evaluations(rows, progress, clock, fleet_steps)
    run.episodes = training_episodes(actors, fleet_steps)
    if require_evals and not run.has_evals:
        raise RunError(f"{p}: no evaluations yet (evaluations.csv is missing or empty); "
                       "is the evaluator enabled (evaluator.enabled) and did the run last past its first one?")
    return run


Clock = Callable[[np.ndarray], np.ndarray]  # Unix times -> the run clock


def _clock_from_scrapes(rows: dict[str, np.ndarray], progress: dict[str, np.ndarray]) -> Clock:
    """For a run from before run.json: the run clock's Unix start, from when scrapes first saw each
    evaluation's version."""
    if not rows or len(rows.get("mean_return", ())) == 0:
        return lambda t: np.asarray(t, np.float64) * math.nan
    wall = progress["wall_s"]
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
        origin = max(bounds)
    else:  # no scrape saw one: put the last evaluation at the end of progress.csv
        origin = float(rows["wall_time"][-1] - wall[-1])
    return lambda t: np.asarray(t, np.float64) - origin


class FleetSteps:
    """The fleet's env steps at run-clock times: progress.csv's, interpolated between its rows. Before its
    first row (start-up: the actors step before every service is healthy, and rows begin after), the sum
    over actors of each one's own count at its last finished episode (episodes/*.csv; a lower bound by
    less than an episode per actor), else a straight line from 0 at the command's start."""

    def __init__(self, progress: dict[str, np.ndarray], actors: Sequence[ActorEpisodes] = ()) -> None:
        self.wall, self.steps = progress["wall_s"], progress["env_steps"]
        self.actors = actors

    def __call__(self, wall_s: np.ndarray) -> np.ndarray:
        wall, steps = self.wall, self.steps
        if wall[0] > 0:
            wall, steps = np.concatenate([[0.0], wall]), np.concatenate([[0.0], steps])
        out = np.interp(wall_s, wall, steps)
        early = wall_s < self.wall[0]
        if self.actors and early.any():
            counted = np.zeros(int(early.sum()))
            for a in self.actors:
                last = np.searchsorted(a.wall_s, wall_s[early], side="right") - 1
                counted += np.where(last >= 0, a.own_steps[np.maximum(last, 0)], 0.0)
            out[early] = np.minimum(counted, self.steps[0])
        return out


def place_evaluations(rows: dict[str, np.ndarray], progress: dict[str, np.ndarray],
                      clock: Clock | None = None, fleet_steps: FleetSteps | None = None) -> dict[str, np.ndarray]:
    """evaluations.csv rows on the run clock (``clock``: Unix time to it; default: from the scrapes),
    with env steps from the evaluator or, where it has none, :class:`FleetSteps`."""
    if not rows or len(rows.get("mean_return", ())) == 0:
        return {}
    clock = clock or _clock_from_scrapes(rows, progress)
    t_run = clock(rows["wall_time"])
    env_steps = (fleet_steps or FleetSteps(progress))(t_run)
    if "env_steps" in rows:  # the evaluator's own count, where it recorded one (evaluator.every_steps)
        env_steps = np.where(np.isnan(rows["env_steps"]), env_steps, rows["env_steps"])
    order = np.argsort(t_run, kind="stable")
    return {
        "wall_s": t_run[order],
        "env_steps": env_steps[order],
        "version": rows["version"][order],
        "mean": rows["mean_return"][order],
        "std": rows.get("std_return", np.zeros_like(rows["mean_return"]))[order],
    }


@dataclass
class ActorEpisodes:
    """One actor's training episodes on the run clock, in time order."""

    wall_s: np.ndarray
    own_steps: np.ndarray  # the actor's own env steps when each ended
    returns: np.ndarray


def actor_episodes(folder: Path, clock: Clock) -> list[ActorEpisodes]:
    """Each actor's episodes/*.csv whose rows carry Unix times (``wall_time``; older runs' do not)."""
    out = []
    for path in sorted(folder.glob("*.csv")):
        rows = _read_csv(path)
        if "wall_time" not in rows or "episode_return" not in rows:
            continue
        wall = clock(rows["wall_time"])
        keep = ~np.isnan(wall) & ~np.isnan(rows["episode_return"])
        order = np.argsort(wall[keep], kind="stable")
        out.append(ActorEpisodes(wall[keep][order], rows["env_steps"][keep][order],
                                 rows["episode_return"][keep][order]))
    return [a for a in out if len(a.wall_s)]


def training_episodes(actors: Sequence[ActorEpisodes], fleet_steps: FleetSteps) -> dict[str, np.ndarray]:
    """Every actor's training episodes in time order: wall_s, env_steps (the fleet's) and return; empty
    without any."""
    if not actors:
        return {}
    wall = np.concatenate([a.wall_s for a in actors])
    returns = np.concatenate([a.returns for a in actors])
    order = np.argsort(wall, kind="stable")
    return {"wall_s": wall[order], "env_steps": fleet_steps(wall[order]), "return": returns[order]}


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean over the last ``window`` values at each point (fewer at the start)."""
    csum = np.cumsum(np.concatenate([[0.0], values]))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(0, idx - window)
    return np.asarray((csum[idx] - csum[lo]) / (idx - lo))


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


def to_target(run: Run, target: float | None) -> tuple[float, int] | None:
    """(wall_s, env steps) of the first evaluation whose mean reached ``target``: the point the
    evaluation curves show; None if none did."""
    if target is None or not run.has_evals:
        return None
    hits = np.flatnonzero(run.evals["mean"] >= target)
    if not len(hits):
        return None
    return float(run.evals["wall_s"][hits[0]]), int(round(run.evals["env_steps"][hits[0]]))


def summarize(run: Run, target: float | None) -> Summary:
    """Key figures, from the arrays the figures draw. To target: the first evaluation that reached it
    (:func:`to_target`). Rates: mean over progress.csv."""
    p = run.progress
    wall, steps = p["wall_s"], p["env_steps"]
    hit = to_target(run, target)
    means = run.evals["mean"] if run.has_evals else np.array([math.nan])
    training = run.episodes.get("return", np.array([]))
    return Summary(
        run=run.name, config=run.config, algorithm=run.algorithm, actors=run.actors, sync=run.sync, target=target,
        evaluations=len(run.evals["mean"]) if run.has_evals else 0,
        final_return=float(means[-1]), best_return=float(np.nanmax(means)),
        seconds=float(wall[-1]), env_steps=int(steps[-1]),
        seconds_to_target=None if hit is None else hit[0], env_steps_to_target=None if hit is None else hit[1],
        steps_per_s=_rate(steps, wall), updates_per_s=_rate(p.get("updates", np.zeros_like(wall)), wall),
        ready_s=run.ready_s,
        training_return=float(training[-TRAINING_WINDOW:].mean()) if len(training) else None,
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
