"""The weights of the best evaluation so far, kept as RUN_DIR/evaluator/best.pt.

The evaluator knows every evaluation and holds the weights it scored, so it keeps them whenever an
evaluation's mean return beats the best before it (whichever service trained them: a learner or
gradient workers). The file is a checkpoint `rlfleet eval` reads as it reads the learner's: ``core``
(empty: no learner state), ``version``, ``config`` and the scored ``weights``, plus ``evaluation``
(mean, std, env steps). A restarted evaluator reads the best back, so only a better one replaces it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.common.config import Experiment, dump

log = logging.getLogger("rlfleet.evaluator")

BEST = "best.pt"


def best_path(run_dir: str | Path) -> Path:
    """Where the evaluator keeps the best evaluation's weights."""
    return Path(run_dir) / "evaluator" / BEST


class BestKeeper:
    """Writes ``best.pt`` when an evaluation's mean return beats the best so far."""

    def __init__(self, cfg: Experiment) -> None:
        self.cfg = cfg
        self.path = best_path(cfg.run_dir)
        self.best: float | None = None
        try:
            from rlfleet.common.algorithms.checkpoint import load_checkpoint

            state = load_checkpoint(self.path)
        except Exception as exc:  # an unreadable file is replaced by the next evaluation
            log.warning("evaluator: %s cannot be read (%s): the next evaluation replaces it", self.path, exc)
            state = None
        if state is not None and isinstance(state.get("evaluation"), Mapping):
            mean = state["evaluation"].get("mean")
            self.best = float(mean) if isinstance(mean, int | float) else None

    def offer(self, version: int, mean: float, std: float, env_steps: int | None,
              weights: Mapping[str, np.ndarray]) -> bool:
        """Keep ``weights`` if ``mean`` beats the best so far; True when written."""
        if self.best is not None and not mean > self.best:
            return False
        import torch

        from rlfleet.common.algorithms.checkpoint import save_checkpoint

        state: dict[str, Any] = {
            "core": {}, "version": int(version), "config": dump(self.cfg),
            "weights": {k: torch.from_numpy(np.array(v, copy=True)) for k, v in weights.items()},
            "evaluation": {"mean": float(mean), "std": float(std),
                           "env_steps": -1 if env_steps is None else int(env_steps)},
        }
        try:
            save_checkpoint(self.path, state)
        except OSError as exc:
            log.warning("evaluator: best weights not written to %s (%s)", self.path, exc)
            return False
        self.best = float(mean)
        return True
