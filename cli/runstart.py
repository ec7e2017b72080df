"""What a run was asked for and when its command started, as ``RUN_DIR/run.json``.

Written when a run starts (`rlfleet up`, `rlfleet train --serial`, :func:`rlfleet.train`), before any
service: the target it will stop on (``until_return``), its budgets, and its clock. `rlfleet report`
draws the target and puts every timestamped file of the run (evaluations.csv, episodes/*.csv: Unix
time) on the run's clock with it.

The run clock (progress.csv's ``wall_s``, ending.json's ``wall_s``) counts seconds from the start of
the command, start-up included. ``clock`` holds one ``[unix_time, wall_s]`` pair per command that ran
in the directory: ``[[started_at, 0.0]]``, and for each ``rlfleet up --resume`` the Unix time it
started and the wall seconds the run had then.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FILE = "run.json"


class RunStartError(ValueError):
    """run.json is not one this module wrote; the message says why."""


@dataclass
class RunStart:
    started_at: float  # Unix time the command started
    until_return: float | None  # the eval return it stops on (--until-return), None: none given
    max_env_steps: int | None
    max_seconds: float | None
    clock: list[list[float]] = field(default_factory=list)  # [unix_time, wall_s] per command; see above
    ready_s: float | None = None  # wall_s when every service was first healthy (fleets; None: serial, or not yet)

    def __post_init__(self) -> None:
        if not self.clock:
            self.clock = [[self.started_at, 0.0]]

    def wall_s(self, unix_time: np.ndarray | float) -> np.ndarray:
        """Unix times on the run clock (each by the command that was running then)."""
        t = np.asarray(unix_time, np.float64)
        starts = np.array([c[0] for c in self.clock])
        offsets = np.array([c[1] for c in self.clock])
        i = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, len(starts) - 1)
        return np.asarray(t - starts[i] + offsets[i])


def write(run_dir: str | Path, start: RunStart) -> Path:
    path = Path(run_dir) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(start), indent=1) + "\n")
    tmp.replace(path)
    return path


def read(run_dir: str | Path) -> RunStart | None:
    """The run's start record; None for a run directory made before run.json existed."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    try:
        data: Any = json.loads(path.read_text())
        return RunStart(**data)
    except (ValueError, TypeError) as exc:
        raise RunStartError(f"{path}: not an rlfleet run start ({exc})") from None


def begin(run_dir: str | Path, started_at: float, until_return: float | None, max_env_steps: int | None,
          max_seconds: float | None, resumed_wall_s: float | None = None) -> RunStart:
    """Record a command starting in ``run_dir``: a new run, or with ``resumed_wall_s`` (the wall seconds
    the run had) a resumed one, whose earlier clock is kept. Returns what was written."""
    before = read(run_dir) if resumed_wall_s is not None else None
    if before is None:
        start = RunStart(started_at, until_return, max_env_steps, max_seconds)
        if resumed_wall_s:  # a run from before run.json: its own clock is not known, this command's is
            start.clock = [[started_at, resumed_wall_s]]
    else:
        start = RunStart(before.started_at, until_return, max_env_steps, max_seconds,
                         [*before.clock, [started_at, resumed_wall_s or 0.0]], before.ready_s)
    write(run_dir, start)
    return start
