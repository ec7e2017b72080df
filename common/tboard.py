"""TensorBoard scalars in the run directory: ``tensorboard --logdir RUN_DIR/tensorboard``.

One writer per service (``RUN_DIR/tensorboard/<name>/``), so the learner's and the
evaluator's curves sit side by side in one TensorBoard. Never fatal: without the
``tensorboard`` package, or when the directory cannot be written, every call is a
no-op (logged once), and training goes on. With ``logging.wandb`` on, the same scalars
also go to Weights & Biases (:mod:`rlfleet.common.wandb_log`).

    tb = scalar_writer(cfg, "learner")
    tb.add("learner/loss", loss, step=updates)
    tb.close()
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlfleet.common.config import Experiment
    from rlfleet.common.wandb_log import WandbScalars

log = logging.getLogger("rlfleet.tboard")

SUBDIR = "tensorboard"


class ScalarWriter:
    """Scalars to TensorBoard event files (and to W&B when given one); safe to call from one thread,
    no-op when unavailable."""

    def __init__(self, run_dir: str | Path, name: str, flush_secs: float = 5.0, enabled: bool = True,
                 wandb: WandbScalars | None = None) -> None:
        self.path = Path(run_dir) / SUBDIR / name
        self._writer: Any = None
        self.wandb = wandb
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.path.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(str(self.path), flush_secs=max(1, int(flush_secs)))
        except Exception as exc:  # ImportError (no tensorboard), OSError: go on without it
            log.warning("TensorBoard scalars off for %s (%s: %s)", name, type(exc).__name__, exc)

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    def add(self, tag: str, value: float | int | None, step: int, wall_time: float | None = None) -> None:
        """One scalar; None and NaN are skipped (TensorBoard draws NaN as a gap anyway)."""
        self.add_many({tag: value}, step, wall_time)

    def add_many(self, values: dict[str, float | int | None], step: int, wall_time: float | None = None) -> None:
        scalars = {tag: float(v) for tag, v in values.items() if v is not None and not math.isnan(float(v))}
        if self.wandb is not None and scalars:  # one W&B row per call
            self.wandb.add_many(scalars, int(step))
        for tag, v in scalars.items():
            if self._writer is None:
                return
            try:
                self._writer.add_scalar(tag, v, global_step=int(step), walltime=wall_time)
            except Exception as exc:  # a full disk must not stop training
                log.warning("TensorBoard scalars off (%s: %s)", type(exc).__name__, exc)
                self._close_quietly()

    def flush(self) -> None:
        if self._writer is not None:
            try:
                self._writer.flush()
            except Exception:
                self._close_quietly()

    def close(self) -> None:
        self._close_quietly()
        if self.wandb is not None:
            self.wandb.close()

    def _close_quietly(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # closing is best effort
                pass


def scalar_writer(cfg: Experiment, name: str, job: str | None = None) -> ScalarWriter:
    """A service's writer: TensorBoard in ``RUN_DIR/tensorboard/<name>``, and W&B too with ``logging.wandb``
    (``job``: the kind of service, W&B's job type; default ``name``)."""
    wandb = None
    if cfg.logging.wandb:
        from rlfleet.common.wandb_log import WandbScalars

        wandb = WandbScalars(cfg.logging, cfg.run_dir, name, job or name)
    return ScalarWriter(cfg.run_dir, name, wandb=wandb)


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under ``log_dir`` as tag -> [(step, value)], read back from the event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for events in sorted({p.parent for p in Path(log_dir).rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out
