"""How a run ended, as the launcher and the serial runner leave it in ``RUN_DIR/ending.json``.

Written once, when the run stops: `rlfleet status --run` reads it to say how a finished run ended,
and the Python API (:mod:`rlfleet`) builds its ``Run`` from it. A run directory without it is a run
still going, or one whose launcher was killed before it could write it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FILE = "ending.json"

# how: target (an evaluation reached until_return), budget (max env steps or seconds spent first),
# stopped (a signal or a KeyboardInterrupt), failed (a member died, or the fleet could not start)
HOWS = ("target", "budget", "stopped", "failed")


class EndingError(ValueError):
    """ending.json is missing or not one this module wrote; the message says which."""


@dataclass
class Ending:
    how: str
    detail: str  # one line for a person: what reached what, which budget, which signal, what failed
    code: int  # the exit code the command returned
    env_steps: int
    wall_s: float  # from the command's start (a fleet's start-up included; the serial loop's start)
    started_at: float  # Unix time of that moment
    best_return: float | None
    until_return: float | None
    max_env_steps: int | None
    max_seconds: float | None

    def __post_init__(self) -> None:
        if self.how not in HOWS:
            raise EndingError(f"ending how={self.how!r}; allowed: {', '.join(HOWS)}")

    def summary(self) -> str:
        best = "none" if self.best_return is None else f"{self.best_return:.1f}"
        head = {"target": "target reached", "budget": "budget spent", "stopped": "stopped",
                "failed": "failed"}[self.how]
        return (f"{head}: {self.detail} ({self.env_steps} env steps, {self.wall_s:.1f} s; "
                f"best evaluation {best})")


def write(run_dir: str | Path, ending: Ending) -> Path:
    path = Path(run_dir) / FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(ending), indent=1) + "\n")
    tmp.replace(path)
    return path


def read(run_dir: str | Path) -> Ending:
    """The ending of a finished run; EndingError if it has none (still running, or killed) or a bad one."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        raise EndingError(f"{path}: no such file (the run is still going, or its launcher was killed)")
    try:
        data: Any = json.loads(path.read_text())
        return Ending(**data)
    except (ValueError, TypeError) as exc:
        raise EndingError(f"{path}: not an rlfleet run ending ({exc})") from None
