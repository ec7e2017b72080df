"""A replay shard's snapshots, and its recovery from the last snapshot and the log.

A snapshot copies every table (and the senders' last seqs) in the loop thread
and is written in a thread by :class:`~services.replay.storage.Snapshotter`;
the log segments it covers are dropped once it is on disk. Recovery loads the
snapshot, then replays the log from the first segment the snapshot does not
cover.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from common.wire.dedup import Dedup
from common.wire.frames import FRAMES
from services.replay.columnar import Table
from services.replay.storage import SNAPSHOT, Snapshotter, WriteAheadLog, read_snapshot
from services.replay.tables import QueueTable

log = logging.getLogger(__name__)


def start_snapshot(snapshotter: Snapshotter, wal: WriteAheadLog | None, shard: int, tables: dict[str, Table],
                   dedup: Dedup) -> None:
    """Copy every table now (in the caller's thread); ``snapshotter`` writes the copy in a thread."""
    covered = wal.rotate() if wal is not None else 0
    index: dict[str, Any] = {"format": 1, "shard": shard, "time": time.time(), "wal_segment": covered,
                             "dedup": dedup.state(), "tables": {}}
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
        dedup.restore(index.get("dedup", {}))
        covered = int(index.get("wal_segment", 0))
    if wal is not None:
        for header, arrays in wal.replay(covered, wal.segment):
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
