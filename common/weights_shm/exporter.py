"""The shard's side: one file per exported version, retired when dropped, reclaimed once no reader maps it."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfleet.common.weights_shm.files import (
    MAX_FREE,
    MAX_RETIRED,
    PREFIX,
    SHM_DIR,
    allocate,
    clean_stale,
    discard,
    fill,
    layout_of,
    reclaim,
)

log = logging.getLogger(__name__)


class ShmExporter:
    """Server side: one file per exported version; the probe file lives as long as the server."""

    def __init__(self, shard: int, directory: str = SHM_DIR) -> None:
        if directory == SHM_DIR:
            clean_stale()
        self.base = f"{directory}/{PREFIX}{os.getpid()}-{secrets.token_hex(16)}-s{shard}"
        self.probe = f"{self.base}-probe"
        fd = os.open(self.probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        self.files: dict[int, tuple[str, list[list[Any]]]] = {}  # version -> (path, descriptors)
        self.retired: list[str] = []  # files of dropped versions, oldest first, maybe still mapped
        self.free: list[tuple[str, int]] = []  # (path, size): reclaimed files no reader maps
        # A file of the last version's size with its pages already allocated, so that
        # exporting the next version is one copy, not a copy plus page faults.
        self.spare: tuple[str, int] | None = None
        self.last_size = 0
        self._count = 0

    def export(self, version: int, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """The ``weights.shm`` field for ``version`` (written on first call)."""
        if version not in self.files:
            self.files[version] = self._write(version, arrays)
        path, descriptors = self.files[version]
        return {"path": path, "probe": self.probe, "arrays": descriptors}

    def _write(self, version: int, arrays: Mapping[str, np.ndarray]) -> tuple[str, list[list[Any]]]:
        descriptors, size = layout_of(arrays)
        self.last_size = size
        path = f"{self.base}-v{version}"
        if self.spare is None or self.spare[1] != size:
            reused = self.take_free(size)
            if reused is not None:
                if self.spare is not None:
                    discard(self.spare[0])
                self.spare = (reused, size)
        if self.spare is not None and self.spare[1] == size:
            os.rename(self.spare[0], path)  # no reader maps it: its name was never sent, or it was reclaimed
            self.spare = None
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        else:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, size)
        fill(fd, path, descriptors, arrays)
        return path, descriptors

    def adopt(self, version: int, path: str, descriptors: list[list[Any]]) -> bool:
        """Take over a publisher's file (already mapped and checked) as ``version``'s file.

        False when it cannot be renamed into this shard's names (e.g. the
        publisher gave up and removed it): the file is removed and readers get
        the version exported on demand, as for a publish that came as frames.
        """
        mine = f"{self.base}-v{version}"
        try:
            os.rename(path, mine)
        except OSError as exc:
            log.debug("could not take over %s as %s: %s", path, mine, exc)
            with contextlib.suppress(OSError):
                os.unlink(path)
            return False
        self.files[version] = (mine, descriptors)
        return True

    def prepare_spare(self) -> None:
        """Have the next version's file ready ahead of time (call when idle): a reclaimed one or a new one."""
        if self.spare is not None or not self.last_size:
            return
        reused = self.take_free(self.last_size)
        if reused is not None:
            self.spare = (reused, self.last_size)
            return
        self._count += 1
        path = f"{self.base}-spare{self._count}"
        allocate(path, self.last_size)
        self.spare = (path, self.last_size)

    def drop(self, version: int) -> None:
        """Retire ``version``'s file: reused once no reader maps it (see reclaim)."""
        entry = self.files.pop(version, None)
        if entry is not None:
            self.retired.append(entry[0])
            while len(self.retired) > MAX_RETIRED:  # readers keep them: let their pages go with the readers
                discard(self.retired.pop(0))

    def reclaim(self) -> None:
        """Move the retired files no reader maps any more to the free list (renamed, so none can map them)."""
        still: list[str] = []
        for path in self.retired:
            self._count += 1
            got = reclaim(path, f"{self.base}-free{self._count}")
            if got is None:
                still.append(path)
            elif got[0]:
                self.free.append(got)
        self.retired = still
        while len(self.free) > MAX_FREE:
            discard(self.free.pop(0)[0])

    def take_free(self, size: int | None = None) -> str | None:
        """A reclaimed file (of ``size`` bytes, if given) to write again, or None."""
        for k, (path, n) in enumerate(self.free):
            if size is None or n == size:
                del self.free[k]
                return path
        return None

    def close(self) -> None:
        for version in list(self.files):
            self.drop(version)
        for path in [*self.retired, *(p for p, _ in self.free)]:
            discard(path)
        self.retired.clear()
        self.free.clear()
        if self.spare is not None:
            discard(self.spare[0])
            self.spare = None
        discard(self.probe)
