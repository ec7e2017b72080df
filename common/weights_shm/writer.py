"""The publisher's side: each shard's slice of a version written once into a file handed over to the shard."""

from __future__ import annotations

import itertools
import os
import secrets
import stat
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfleet.common.weights_shm.files import NAME, PREFIX, PUBLISHED, SHM_DIR, allocate, discard, fill, layout_of


class ShmWriter:
    """Publisher side: one new file per shard slice and version, handed over to the shard.

    A file belongs to the shard once the shard answered the publish that
    names it (it renames or removes it); ``discard`` removes one the shard
    never answered for. A spare file per shard, allocated after each publish,
    makes the next write one copy without page allocation.
    """

    def __init__(self, directory: str = SHM_DIR) -> None:
        self.base = f"{directory}/{PREFIX}{os.getpid()}-{secrets.token_hex(16)}-pub"
        self.spares: dict[int, tuple[str, int]] = {}  # shard -> (path, size)
        self.sizes: dict[int, int] = {}  # shard -> size of its last slice
        self._count = itertools.count(1)  # next() is atomic: slices are written by several threads

    def _name(self) -> str:
        return f"{self.base}{next(self._count)}"

    def write(self, shard: int, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Write ``arrays`` to a new file; returns the ``publish.shm`` field naming it."""
        descriptors, size = layout_of(arrays)
        self.sizes[shard] = size
        spare = self.spares.pop(shard, None)
        if spare is not None and spare[1] == size:
            path = spare[0]
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        else:
            if spare is not None:
                discard(spare[0])
            path = self._name()
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, size)
        fill(fd, path, descriptors, arrays)
        return {"path": path, "arrays": descriptors}

    def prepare(self, shard: int) -> None:
        """Allocate ``shard``'s next file now (after a publish, off the readers' path)."""
        size = self.sizes.get(shard)
        if size is None or shard in self.spares:
            return
        path = self._name()
        allocate(path, size)
        self.spares[shard] = (path, size)

    def take_back(self, shard: int, paths: Any) -> None:
        """Reuse files a shard handed back (``publish_ack.free``) as ``shard``'s next file.

        Each must be a regular file of ours in /dev/shm under a shard's name (no
        symlink, no published version); others are left alone. One of the slice's
        size becomes the shard's spare under one of this writer's names; the rest
        (a spare already kept, another size) are removed: handed to us, ours to remove.
        """
        if not isinstance(paths, list):
            return
        size = self.sizes.get(shard)
        for path in paths:
            if not isinstance(path, str) or not NAME.match(path) or ".." in path or PUBLISHED.match(path):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()):
                continue
            if shard in self.spares or st.st_size != size:
                discard(path)  # handed to us: ours to remove
                continue
            mine = self._name()
            try:
                os.rename(path, mine)
            except OSError:
                continue
            self.spares[shard] = (mine, st.st_size)

    def close(self) -> None:
        for path, _ in self.spares.values():
            discard(path)
        self.spares.clear()
