"""A shard's versions in this host's /dev/shm (common/weights_shm), for readers on the same host.

A version is written to a file the first time a same-host reader asks for it; files of dropped
versions are reclaimed once no reader maps them and handed to the publisher for its next slice.
Shared memory that fails (a full /dev/shm) is warned about once per spell: readers get frames
until it works again.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from rlfleet.common import weights_shm as shmlib
from rlfleet.services.paramserver.weights_store import Held

log = logging.getLogger(__name__)


class ShmVersions:
    """The shard's :class:`~rlfleet.common.weights_shm.ShmExporter` (None when shared memory is off) and the
    state of its failures.

    ``directory`` is where version files go; readers map only /dev/shm/rlfleet-ps-*, so another
    directory is only useful to tests (e.g. one that disappears, to make every export fail).
    """

    def __init__(self, name: str, shard: int, enabled: bool, directory: str = shmlib.SHM_DIR,
                 reclaim_every_s: float = 0.05) -> None:
        self.name = name  # for log lines
        self.reclaim_every_s = reclaim_every_s
        self.exporter: shmlib.ShmExporter | None = None
        if enabled and (directory != shmlib.SHM_DIR or shmlib.available()):
            try:
                self.exporter = shmlib.ShmExporter(shard, directory)
            except OSError as exc:
                log.warning("shared memory for same-host readers is off: %s", exc)
        self._failed = -1  # a version whose export failed: served with frames, not retried
        self._failing = False  # warned once; cleared (and said so) when an export works again
        self._next_reclaim = 0.0  # tick() runs after every burst: look at retired files once an interval

    @property
    def enabled(self) -> bool:
        return self.exporter is not None

    def export(self, held: Held) -> dict[str, Any] | None:
        """The ``weights.shm`` field for ``held``, or None (use frames) when shared memory fails."""
        if self.exporter is None or held.version == self._failed:
            return None
        try:
            desc = self.exporter.export(held.version, held.arrays)
        except OSError as exc:  # ENOSPC: /dev/shm is full; readers get frames until it is not
            self._failed = held.version
            self._trouble(f"could not write version {held.version} to shared memory", exc)
            return None
        if self._failing:
            log.info("%s: shared memory works again (version %d)", self.name, held.version)
            self._failing = False
        return desc

    def adopt(self, version: int, path: str, descriptors: list[list[Any]]) -> bool:
        """Serve the publisher's file ``path`` as ``version``'s file; False if it cannot be."""
        return self.exporter is not None and self.exporter.adopt(version, path, descriptors)

    def take_free(self) -> str | None:
        """A file no reader maps any more, for the publisher to write its next slice into."""
        return self.exporter.take_free() if self.exporter is not None else None

    def retire(self, dropped: list[int]) -> None:
        """The store dropped these versions: their files go once no reader maps them."""
        if self.exporter is None:
            return
        for version in dropped:
            self.exporter.drop(version)
        self._reclaim()

    def tick(self, now: float) -> None:
        exporter = self.exporter
        if exporter is None:
            return
        if exporter.retired and now >= self._next_reclaim:
            self._next_reclaim = now + self.reclaim_every_s
            self._reclaim()  # files that readers let go of since the last publish
        if exporter.spare is None and exporter.last_size and not self._failing:
            try:
                exporter.prepare_spare()
            except OSError as exc:  # /dev/shm full: the next export allocates as it goes
                self._trouble("could not prepare a shared-memory file", exc)

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.close()

    def _reclaim(self) -> None:
        assert self.exporter is not None
        if self.exporter.retired:
            try:
                self.exporter.reclaim()
            except OSError as exc:
                self._trouble("could not reclaim a shared-memory file", exc)

    def _trouble(self, what: str, exc: OSError) -> None:
        """Warn once per spell of failures (a full /dev/shm would otherwise flood the log)."""
        if not self._failing:
            full = " (/dev/shm is full)" if exc.errno == errno.ENOSPC else ""
            log.warning("%s: %s: %s%s; same-host readers get frames until it works again",
                        self.name, what, exc, full)
        self._failing = True
