"""A finished run as Python values, read from its run directory (ending.json, evaluations.csv)."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from rlfleet.cli.ending import Ending, EndingError
from rlfleet.cli.ending import read as read_ending


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of the run: the evaluator's mean greedy return of a weights version."""

    wall_s: float  # from the run's start (ending.json's started_at)
    env_steps: int | None  # the fleet's env steps when it was made (None: the evaluator did not know them)
    version: int
    mean: float
    std: float


@dataclass
class Run:
    """A finished run: where it is, how it ended and what its evaluations were."""

    run_dir: Path
    ending: Ending
    evaluations: list[Evaluation] = field(default_factory=list)

    @property
    def solved(self) -> bool:
        """An evaluation reached the target the run was given (``until_return``)."""
        return self.ending.how == "target"

    @property
    def env_steps(self) -> int:
        return self.ending.env_steps

    @property
    def wall_s(self) -> float:
        return self.ending.wall_s

    @property
    def best(self) -> Evaluation | None:
        return max(self.evaluations, key=lambda e: e.mean, default=None)

    @property
    def last(self) -> Evaluation | None:
        return self.evaluations[-1] if self.evaluations else None

    @property
    def checkpoint(self) -> Path:
        """The learner's checkpoint of the run (what :func:`rlfleet.load_policy` reads)."""
        return self.run_dir / "learner" / "checkpoint.pt"


def read_run(run_dir: str | Path) -> Run:
    """The run in ``run_dir``; ValueError (EndingError) if it has not ended or is no run directory."""
    path = Path(run_dir).resolve()
    try:
        ending = read_ending(path)
    except EndingError as exc:
        raise EndingError(f"{path} is not a finished run: {exc}") from None
    return Run(path, ending, _evaluations(path / "evaluations.csv", ending.started_at))


def _evaluations(path: Path, started_at: float) -> list[Evaluation]:
    if not path.is_file():
        return []
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                out.append(Evaluation(
                    wall_s=max(0.0, float(row["wall_time"]) - started_at),
                    env_steps=int(float(row["env_steps"])) if row.get("env_steps") else None,
                    version=int(float(row["version"])), mean=float(row["mean_return"]),
                    std=float(row["std_return"])))
            except (KeyError, TypeError, ValueError):
                continue  # a row cut short by a stop mid-write
    return out
