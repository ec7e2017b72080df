"""Weights & Biases beside TensorBoard (``logging.wandb: true``): the same scalars, one W&B run per
service (``<run>/learner``, ``<run>/evaluator``, ``<run>/<actor id>``) grouped by the fleet's run
(``logging.wandb_group``, default the run directory's name), its files in ``RUN_DIR/wandb``.
``wandb`` is not a dependency of rlfleet: asked for and not installed, the experiment is refused at
start-up with how to install it (:func:`missing_wandb`).

Each tag keeps its own x axis, as in TensorBoard: the step it was logged with goes beside it as
``step/<tag>`` (the evaluator logs some tags by weights version, others by env steps).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlfleet.common.config.sections import LoggingConfig

log = logging.getLogger("rlfleet.wandb")

INSTALL_HINT = "pip install wandb (it is in rlfleet's dev extra: pip install -e '.[dev]')"
STEP_PREFIX = "step/"


def missing_wandb() -> str | None:
    """Why ``logging.wandb`` cannot run here (the package is not installed), or None."""
    if importlib.util.find_spec("wandb") is None:
        return f"the wandb package is not installed; {INSTALL_HINT}"
    return None


class WandbScalars:
    """One W&B run of one service; scalars in, failures logged once and then off (training goes on)."""

    def __init__(self, cfg: LoggingConfig, run_dir: str | Path, name: str, job: str) -> None:
        why = missing_wandb()
        if why is not None:
            raise RuntimeError(f"logging.wandb is on but {why}")
        import wandb

        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        group = cfg.wandb_group or run_dir.name
        self._steps: set[str] = set()
        try:
            self._run: Any = wandb.init(
                project=cfg.wandb_project, entity=cfg.wandb_entity, group=group, name=f"{group}/{name}",
                job_type=job, dir=str(run_dir), mode=cfg.wandb_mode,
                settings=wandb.Settings(console="off", silent=True, reinit="create_new"))
        except Exception as exc:  # asked for and not there: say so rather than train without it
            raise RuntimeError(f"logging.wandb: the W&B run {group}/{name} did not start ({type(exc).__name__}: "
                               f"{exc}); log in (wandb login) or set logging.wandb_mode: offline") from exc

    def add_many(self, values: dict[str, float], step: int) -> None:
        if self._run is None:
            return
        row: dict[str, float | int] = {}
        try:
            for tag, value in values.items():
                if tag not in self._steps:
                    self._run.define_metric(tag, step_metric=STEP_PREFIX + tag)
                    self._steps.add(tag)
                row[tag] = value
                row[STEP_PREFIX + tag] = step
            self._run.log(row)
        except Exception as exc:  # a full disk or a lost connection must not stop training
            log.warning("W&B scalars off (%s: %s)", type(exc).__name__, exc)
            self.close()

    def close(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            try:
                run.finish()
            except Exception as exc:  # closing is best effort
                log.warning("W&B run did not finish cleanly (%s: %s)", type(exc).__name__, exc)


WANDB_HEADER = 7  # ":W&B", a 2-byte magic and a version byte
BLOCK = 32 << 10  # then LevelDB's log format: records in 32 KiB blocks, each a 7-byte header and its data
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(raw: bytes) -> list[bytes]:
    """The records of a .wandb file (checksums not checked: a reader for tests and inspection)."""
    if raw[:4] != b":W&B":
        raise ValueError("not a .wandb file")
    out, parts, pos = [], b"", WANDB_HEADER
    while pos + 7 <= len(raw):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(raw[pos + 4:pos + 6], "little"), raw[pos + 6]
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == FULL:
            out.append(data)
        elif kind in (FIRST, MIDDLE):
            parts = (b"" if kind == FIRST else parts) + data
        elif kind == LAST:
            out.append(parts + data)
        else:  # zeros: the unwritten rest of the file
            break
    return out


def _parsed(path: Path, wait_s: float) -> list[Any]:
    """The records of one run's file; up to ``wait_s`` for its exit record (W&B's core process writes the
    file after ``finish`` has returned)."""
    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + wait_s
    while True:
        records = []
        for data in _records(path.read_bytes()):
            record = pb.Record()  # type: ignore[attr-defined]  # generated protobuf code
            record.ParseFromString(data)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() >= deadline:
            return records
        time.sleep(0.05)


def read_offline_scalars(run_dir: str | Path, wait_s: float = 0.0) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Every scalar of the W&B runs in ``RUN_DIR/wandb`` as run name -> tag -> [(step, value)], read back
    from their .wandb files (an offline run, or an online one's local copy), as
    :func:`rlfleet.common.tboard.read_scalars` reads TensorBoard's; ``wait_s``: how long to wait for a
    finished run's file to be complete."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for path in sorted(Path(run_dir, "wandb").glob("*run-*/run-*.wandb")):
        name, rows = path.stem, []
        for record in _parsed(path, wait_s):
            kind = record.WhichOneof("record_type")
            if kind == "run" and record.run.display_name:
                name = record.run.display_name
            elif kind == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
        scalars = out.setdefault(name, {})
        for row in rows:
            for tag, value in row.items():
                if STEP_PREFIX + tag in row:
                    scalars.setdefault(tag, []).append((int(row[STEP_PREFIX + tag]), float(value)))
    return out
