"""Learner checkpoints on local disk: written atomically, read with weights_only=True.

A checkpoint is what ``LearnerCore.state()`` returns: tensors, dicts, lists,
tuples, numbers, strings and None, nothing that needs unpickling of classes.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
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
