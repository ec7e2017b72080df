"""Learner checkpoints on local disk: written atomically, read with weights_only=True.

A checkpoint is what ``LearnerCore.state()`` returns: tensors, dicts, lists,
tuples, numbers, strings and None, nothing that needs unpickling of classes.
:class:`CheckpointWriter` writes them on a thread of its own, so a training loop
only takes the snapshot.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch


def save_checkpoint(path: str | Path, state: Mapping[str, Any]) -> None:
    """Write ``state`` so that ``path`` is always either the old file or the complete new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(dict(state), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


class CheckpointWriter:
    """Writes checkpoints (:func:`save_checkpoint`) on one thread of its own, one at a time.

    :meth:`write` hands over a snapshot that nothing else changes (a learner's ``state()``: CPU copies)
    and returns once the previous write has finished: at most one write in flight, so at most two
    snapshots in memory. A write that failed raises its error from the next :meth:`write`,
    :meth:`wait` or :meth:`close`, on the caller's thread.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending: Future[None] | None = None

    def write(self, path: str | Path, state: Mapping[str, Any], written: Callable[[], None] | None = None) -> None:
        """Write ``state`` to ``path`` in the background; ``written`` is called (on the writer's thread) once it is."""
        self.wait()
        self._pending = self._pool.submit(self._write, Path(path), state, written)

    @staticmethod
    def _write(path: Path, state: Mapping[str, Any], written: Callable[[], None] | None) -> None:
        save_checkpoint(path, state)
        if written is not None:
            written()

    def wait(self) -> None:
        """Until the write in flight (if any) is on disk; its error, if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)


def load_checkpoint(path: str | Path) -> dict[str, Any] | None:
    """The checkpoint at ``path`` on CPU, or None if there is none yet.

    ``weights_only=True``: a checkpoint cannot run code when it is loaded.
    """
    path = Path(path)
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {str(path)!r} does not hold a mapping")
    return state
