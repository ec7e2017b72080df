"""How a shard serves versions through this host's /dev/shm (common/weights_shm): a mixin of
:class:`~services.paramserver.shard.ShardServer`.

A version is written to a file the first time a same-host reader asks for it; files of dropped
versions are reclaimed once no reader maps them and handed to the publisher for its next slice.
Shared memory that fails (a full /dev/shm) is warned about once per spell: readers get frames
until it works again.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from common import weights_shm as shmlib

log = logging.getLogger("services.paramserver.shard")


class ShmVersions:
    name: str
    tick_interval_s: float

    def _init_shm(self, shard: int, shm: bool, shm_dir: str) -> None:
        self.shm: shmlib.ShmExporter | None = None
        if shm and (shm_dir != shmlib.SHM_DIR or shmlib.available()):
            try:
                self.shm = shmlib.ShmExporter(shard, shm_dir)
            except OSError as exc:
                log.warning("shared memory for same-host readers is off: %s", exc)
        self._shm_failed = -1  # a version whose export failed: served with frames, not retried
        self._shm_failing = False  # warned once; cleared (and said so) when an export works again
        self._next_reclaim = 0.0  # tick() runs after every burst: look at retired files once a tick interval

    def _reclaim(self) -> None:
        assert self.shm is not None
        if self.shm.retired:
            try:
                self.shm.reclaim()
            except OSError as exc:
                self._shm_trouble("could not reclaim a shared-memory file", exc)

    def _export(self, held: Any) -> dict[str, Any] | None:
        """The ``weights.shm`` field for ``held``, or None (use frames) when shared memory fails."""
        if self.shm is None or held.version == self._shm_failed:
            return None
        try:
            desc = self.shm.export(held.version, held.arrays)
        except OSError as exc:  # ENOSPC: /dev/shm is full; readers get frames until it is not
            self._shm_failed = held.version
            self._shm_trouble(f"could not write version {held.version} to shared memory", exc)
            return None
        if self._shm_failing:
            log.info("%s: shared memory works again (version %d)", self.name, held.version)
            self._shm_failing = False
        return desc

    def _shm_trouble(self, what: str, exc: OSError) -> None:
        """Warn once per spell of shared-memory failures (a full /dev/shm would otherwise flood the log)."""
        if not self._shm_failing:
            full = " (/dev/shm is full)" if exc.errno == errno.ENOSPC else ""
            log.warning("%s: %s: %s%s; same-host readers get frames until it works again",
                        self.name, what, exc, full)
        self._shm_failing = True

    def _tick_shm(self, now: float) -> None:
        if self.shm is not None and self.shm.retired and now >= self._next_reclaim:
            self._next_reclaim = now + self.tick_interval_s
            self._reclaim()  # files that readers let go of since the last publish
        if self.shm is not None and self.shm.spare is None and self.shm.last_size and not self._shm_failing:
            try:
                self.shm.prepare_spare()
            except OSError as exc:  # /dev/shm full: the next export allocates as it goes
                self._shm_trouble("could not prepare a shared-memory file", exc)
