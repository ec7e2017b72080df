"""A replay shard's snapshots, and its recovery from the last snapshot and the log.

A snapshot copies every table (and the senders' last seqs) in the loop thread
and is written in a thread by :class:`~rlfleet.services.replay.storage.Snapshotter`;
the log files it covers are dropped once it is on disk. Recovery loads the
snapshot, then replays the log from the first file the snapshot does not
cover.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.common.wire.dedup import Dedup
from rlfleet.common.wire.frames import FRAMES
from rlfleet.services.replay.columnar import Table
from rlfleet.services.replay.storage import SNAPSHOT, Snapshotter, WriteAheadLog, read_snapshot
from rlfleet.services.replay.tables import QueueTable

log = logging.getLogger(__name__)

COVERED = "wal_file"  # the snapshot index's key: the last log file the snapshot covers


@dataclass
class Recovery:
    """Owns a shard's snapshots: their writer, when the last one started, and when the next is due;
    restores the tables and dedup it is handed from the snapshot and the log (``wal``) at start."""

    directory: Path | None
    durability: str
    every_s: float
    wal: WriteAheadLog | None
    shard: int
    tables: dict[str, Table]
    dedup: Dedup
    snapshot_seconds: Any  # the replay_snapshot_seconds gauge
    snapshotter: Snapshotter | None = field(init=False)
    last_snapshot: float = field(init=False, default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.durability != "memory" and self.directory is None:
            raise ValueError(f"durability={self.durability} needs a directory")
        self.snapshotter = Snapshotter(self.directory / SNAPSHOT) if self.directory is not None else None

    @property
    def snapshots(self) -> int:
        return self.snapshotter.count if self.snapshotter is not None else 0

    def due(self, now: float) -> bool:
        """Time for a periodic snapshot (never with ``memory`` durability, nor while one is written)."""
        return (self.durability != "memory" and now - self.last_snapshot >= self.every_s
                and self.snapshotter is not None and not self.snapshotter.busy)

    def snapshot(self, wait: bool = False) -> None:
        """Copy every table now (in the caller's thread: the loop's); write the copy in a thread."""
        if self.snapshotter is None:
            return
        self.snapshotter.wait()
        self.last_snapshot = time.monotonic()
        start_snapshot(self.snapshotter, self.wal, self.shard, self.tables, self.dedup)
        if wait:
            self.snapshotter.wait()
        self.snapshot_seconds.set(self.snapshotter.last_seconds)

    def restore(self) -> int:
        """Load the snapshot and replay the log; returns the items restored."""
        if self.directory is None or self.durability == "memory":
            return 0
        restore_tables(self.directory, self.wal, self.shard, self.tables, self.dedup)
        return sum(t.size for t in self.tables.values())

    def wait(self) -> None:
        """Until the snapshot being written (if any) is on disk."""
        if self.snapshotter is not None:
            self.snapshotter.wait()


def start_snapshot(snapshotter: Snapshotter, wal: WriteAheadLog | None, shard: int, tables: dict[str, Table],
                   dedup: Dedup) -> None:
    """Copy every table now (in the caller's thread); ``snapshotter`` writes the copy in a thread."""
    covered = wal.rotate() if wal is not None else 0
    index: dict[str, Any] = {"format": 1, "shard": shard, "time": time.time(), COVERED: covered,
                             "dedup": dedup.state(), "dedup_watermark": dedup.watermark, "tables": {}}
    arrays: dict[str, np.ndarray] = {}
    for name, t in tables.items():
        meta, arrs = t.state()
        index["tables"][name] = meta
        arrays.update({f"{name}/{col}": a for col, a in arrs.items()})
    then = (lambda: wal.drop_through(covered)) if wal is not None else None
    snapshotter.start(index, arrays, then)


def restore_tables(directory: Path, wal: WriteAheadLog | None, shard: int, tables: dict[str, Table],
                   dedup: Dedup) -> None:
    """Load the snapshot in ``directory`` and replay the log into ``tables`` and ``dedup``."""
    covered = 0
    path = directory / SNAPSHOT
    if path.exists():
        index, arrays = read_snapshot(path)
        for name, meta in index["tables"].items():
            table = tables.get(name)
            if table is None:
                log.warning("replay shard %d: snapshot table %r is not configured; skipped", shard, name)
                continue
            prefix = f"{name}/"
            table.restore(meta, {k[len(prefix):]: a for k, a in arrays.items() if k.startswith(prefix)})
        dedup.restore(index.get("dedup", {}), int(index.get("dedup_watermark", -1)))
        covered = int(index.get(COVERED, covered_by_older_index(index)))
    if wal is not None:
        for header, arrays in wal.replay(covered, wal.log_file):
            apply_record(tables, dedup, header, arrays)
    for t in tables.values():
        if not isinstance(t, QueueTable):  # a queue's pops are logged; other samples are not
            t.limiter.resume()


def apply_record(tables: dict[str, Table], dedup: Dedup, header: dict[str, Any],
                 arrays: dict[str, np.ndarray]) -> None:
    """Redo one record of the log: an insert not in the tables yet, or a queue's pop."""
    table = tables.get(header["table"])
    if table is None:
        return
    if header["op"] == "pop":
        gone = min(table.size, max(0, int(header["head"]) - table.oldest_key))
        table.size -= gone
        table.limiter.sampled(gone)
        return
    priority = arrays.pop("__priority__", None)
    n = len(next(a for name, a in arrays.items() if name != FRAMES))  # the frames of a packed insert are not items
    key = int(header["key"])
    if key + n > table.next_key:
        if key != table.next_key:
            log.warning("replay: log of table %r jumps from key %d to %d", table.name, table.next_key, key)
            table.next_key, table.size = key, 0
        table.insert(arrays, priority)
    dedup.add(header["sender"], int(header["seq"]), header.get("ws"))


def covered_by_older_index(index: dict[str, Any]) -> int:
    """The last log file an index written before ``COVERED`` was named so says it covers: its one
    other ``wal_*`` key (0 if none), so an older snapshot restores without replaying what it holds."""
    return next((int(v) for k, v in index.items() if k.startswith("wal_") and k != COVERED), 0)
