"""The replay server: a ROUTER loop over tables, with held inserts and held samples.

What the server does is in layers, each a module:

- :mod:`services.replay.held_requests`: what the rate limiter holds (inserts
  and samples), storing and serving them when they may go, and the acks and
  queue batches sent after each burst (after its fsync with ``wal``);
- :mod:`services.replay.fast_insert`: the usual inserts of a connection
  stored from their frames, without a full decode;
- this module: the request handlers, the metrics, the timers, and wiring
  snapshots and recovery (:mod:`services.replay.recovery`).

A sample's ``timeout_ms`` is capped at ``MAX_SAMPLE_TIMEOUT_MS`` (10 minutes),
which is also the wait of a sample without one.

Exactly-once: an insert whose (sender, seq) is already stored is acked again
with ``duplicate=true, stored=0``. With ``wal`` durability every stored
insert is appended to the log before it is stored, and acked only after the
log is fsync'ed.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from common.config import ReplayConfig
from common.metrics import ServiceMetrics
from common.wire.codec import DEFAULT_LIMITS, Limits, Message
from common.wire.decoder import PackedLayout
from common.wire.dedup import Dedup
from common.wire.errors import RequestError
from common.wire.server import Peer
from common.wire.transport import DEFAULT_HWM, CurveConfig
from services.replay.columnar import MAX_SAMPLE_BATCH, Table, TableError
from services.replay.fast_insert import FastInsert, FastInsertServer
from services.replay.held_requests import (
    MAX_HELD_BYTES,
    MAX_HELD_INSERTS,
    MAX_HELD_SAMPLES,
    HeldInsert,
    HeldSample,
)
from services.replay.priorities import check_priorities
from services.replay.recovery import restore_tables, start_snapshot
from services.replay.storage import SNAPSHOT, Snapshotter, WriteAheadLog
from services.replay.tables import QueueTable, make_table

log = logging.getLogger(__name__)

RESERVED = ("key", "probability", "weight", "priority")
MAX_SAMPLE_TIMEOUT_MS = 600_000  # a held sample waits at most this long (also without timeout_ms)


class ReplayServer(FastInsertServer):
    """A replay shard: its tables, the request handlers, metrics and timers, and its durability."""

    def __init__(
        self,
        cfg: ReplayConfig,
        metrics: ServiceMetrics,
        bind: str | Iterable[str],
        *,
        shard: int = 0,
        directory: str | Path | None = None,
        seed: int | None = None,
        limits: Limits = DEFAULT_LIMITS,
        curve: CurveConfig | None = None,
        hwm: int = DEFAULT_HWM,
        ctx: zmq.Context[Any] | None = None,
        max_held_inserts: int = MAX_HELD_INSERTS,
        max_held_samples: int = MAX_HELD_SAMPLES,
        max_held_bytes: int = MAX_HELD_BYTES,
    ) -> None:
        super().__init__(metrics, bind, limits=limits, curve=curve, hwm=hwm, ctx=ctx)
        self.cfg = cfg
        self.max_held_inserts = max_held_inserts
        self.max_held_samples = max_held_samples
        self.max_held_bytes = max_held_bytes
        self.held_bytes = 0
        self.shard = shard
        rng = np.random.default_rng(seed)
        self.tables: dict[str, Table] = {t.name: make_table(t, rng) for t in cfg.tables}
        self.dedup = Dedup()
        self.held_inserts: dict[str, deque[HeldInsert]] = {n: deque() for n in self.tables}
        self.held_keys: set[tuple[str, int]] = set()
        self.held_samples: dict[str, deque[HeldSample]] = {n: deque() for n in self.tables}
        self.held_unlimited: dict[str, deque[HeldSample]] = {n: deque() for n in self.tables}
        # sent after the burst (with wal, after its fsync): queue batches, and acks by sender
        # identity (merge_acks) or by (identity, seq)
        self.deferred: list[tuple[Peer, list[Any], str]] = []
        # by ROUTER identity, then payload bytes: that connection's usual inserts, taken without a full decode
        self.fast: dict[bytes, dict[int, FastInsert]] = {}
        self.fast_inserts = 0  # inserts stored by _insert_fast
        self._learn_failed = False
        # by identity: the layouts of the connection's last inserts that took the full path; a layout
        # is learnt the second time it is seen (fast_insert.py)
        self._full_layouts: dict[bytes, list[PackedLayout]] = {}
        self._stored_packed: tuple[Table, PackedLayout, int, Peer, int | None] | None = None
        self.acks: dict[Any, tuple[Peer, list[tuple[int, int, bool]]]] = {}
        self.duplicates = 0
        self.durability = cfg.durability
        self.dir = Path(directory) if directory is not None else None
        if self.durability != "memory" and self.dir is None:
            raise ValueError(f"durability={self.durability} needs a directory")
        self.snapshotter = Snapshotter(self.dir / SNAPSHOT) if self.dir is not None else None
        self.wal = WriteAheadLog(self.dir) if self.durability == "wal" and self.dir is not None else None
        self.last_snapshot = time.monotonic()
        m = metrics
        self.m_size = m.gauge("replay_size", "Items in each table.", ("table",))
        self.m_inserts = m.counter("replay_inserts", "Items stored, by table.", ("table",))
        self.m_samples = m.counter("replay_samples", "Items sampled, by table.", ("table",))
        self.m_dups = m.counter("replay_duplicates", "Duplicate insert messages dropped, by table.", ("table",))
        self.m_ignored = m.counter("replay_priority_updates_ignored", "Priority updates for evicted keys.",
                                   ("table",))
        self.m_wait = m.counter("rate_limiter_wait_seconds", "Seconds requests were held by the rate limiter.",
                                ("side",))
        self.m_held = m.gauge("rate_limiter_held", "Requests held by the rate limiter now.", ("side",))
        self.m_dropped = m.counter("replay_inserts_dropped",
                                   "Inserts dropped unacked: too many held, or too many bytes held.")
        self.m_snap = m.gauge("replay_snapshot_seconds", "Seconds the last snapshot took to write.")
        self.m_wal_failed = m.counter("replay_wal_failures", "Records the write-ahead log could not take (disk "
                                      "full): inserts refused and queue pops not served, by op.", ("op",))
        for op in ("insert", "pop"):
            self.m_wal_failed.labels(op)  # exported at 0 from the start
        for name in self.tables:
            self.m_size.labels(name).set(0)
        self._m_inserts = {name: self.m_inserts.labels(name) for name in self.tables}
        self._inserted = dict.fromkeys(self.tables, 0)  # items stored since tick() added them to m_inserts
        self._m_size = {name: self.m_size.labels(name) for name in self.tables}  # tick sets them after every burst
        self._m_held_inserts, self._m_held_samples = self.m_held.labels("insert"), self.m_held.labels("sample")
        self._m_wait_insert = self.m_wait.labels("insert")
        for side in ("insert", "sample"):
            self.m_wait.labels(side).inc(0)
        self.route("insert", self.on_insert)
        self.route("sample", self.on_sample)
        self.route("priorities", self.on_priorities)
        self.route("info", self.on_info)

    # -- handlers -------------------------------------------------------------
    def _table(self, name: str) -> Table:
        table = self.tables.get(name)
        if table is None:
            raise RequestError("unknown_table", f"no table {name!r}; tables: {sorted(self.tables)}")
        return table

    def on_insert(self, peer: Peer, msg: Message) -> None:
        table = self._table(msg.body["table"])
        sender, seq = msg.sender, msg.seq
        merge = msg.body.get("merge_acks") is True
        arrays = msg.arrays
        priority = arrays.get("priority")
        if priority is not None:
            arrays = {k: v for k, v in arrays.items() if k != "priority"}
        layout = msg.layout
        known = table.known_batch(arrays)  # the columns of the table's last good batch: nothing more to check
        n = self._check_batch(table, arrays) if known is None else known
        if priority is not None:
            if priority.shape != (n,):
                raise RequestError("bad_priority", f"priority has shape {list(priority.shape)}; needs [{n}]")
            try:
                check_priorities(priority)
            except TableError as exc:
                raise RequestError(exc.reason, exc.detail) from None
        # a resend is checked as the first send was: a duplicate whose content is invalid is refused
        # (with the reason), not acked as stored
        refused = self.dedup.refusal(sender, seq)
        if refused is not None:
            raise RequestError(*refused)
        if self.dedup.seen(sender, seq):
            self._duplicate(table, peer, acked=True, merge=merge)
            return
        if self.held_keys and (sender, seq) in self.held_keys:
            self._duplicate(table, peer, acked=False, merge=merge)
            return
        ws = msg.body.get("window_start")
        ws = ws if isinstance(ws, int) else None
        held = self.held_inserts[table.name]
        if not held and table.can_insert(n):  # nothing queued ahead and the limiter admits it: store now
            self._commit(table, peer, arrays, priority, ws, n, merge)
            if layout is not None and merge:
                self._stored_packed = (table, layout, n, peer, ws)
            if self.held_samples[table.name] or self.held_unlimited[table.name]:
                self._pump(table)
            return
        nbytes = sum(a.nbytes for a in arrays.values()) + (priority.nbytes if priority is not None else 0)
        if len(held) >= self.max_held_inserts or self.held_bytes + nbytes > self.max_held_bytes:
            self.m_dropped.inc()
            return
        held.append(HeldInsert(peer, arrays, priority, ws, n, time.monotonic(), merge, nbytes))
        self.held_bytes += nbytes
        self.held_keys.add((sender, seq))
        self._pump(table)

    def _check_batch(self, table: Table, arrays: dict[str, np.ndarray]) -> int:
        for name in arrays:
            if name in RESERVED:
                raise RequestError("reserved_column", f"column name {name!r} is reserved ({', '.join(RESERVED)})")
        try:
            return table.check(arrays)
        except TableError as exc:
            raise RequestError(exc.reason, exc.detail) from None

    def _duplicate(self, table: Table, peer: Peer, acked: bool, merge: bool) -> None:
        self.duplicates += 1
        self.m_dups.labels(table.name).inc()
        if acked:
            self._defer_ack(peer.identity, peer.seq, peer.sender, 0, True, merge)

    def on_sample(self, peer: Peer, msg: Message) -> None:
        table = self._table(msg["table"])
        bs = msg["batch_size"]
        if not 1 <= bs <= MAX_SAMPLE_BATCH:
            raise RequestError("bad_request", f"batch_size={bs}; allowed: 1..{MAX_SAMPLE_BATCH}")
        beta = msg.get("beta")
        if beta is not None and not 0 <= beta <= 100:
            raise RequestError("bad_request", f"beta={beta}; allowed: 0..100")
        limited = msg.get("rate_limited") is not False
        if not limited and isinstance(table, QueueTable):
            raise RequestError("bad_request", f"rate_limited=false on queue table {table.name!r}: its items are "
                                              "removed when sampled; allowed: only on uniform and prioritized tables")
        held, unlimited = self.held_samples[table.name], self.held_unlimited[table.name]
        if len(held) + len(unlimited) >= self.max_held_samples:
            raise RequestError("busy", f"{len(held) + len(unlimited)} samples already held on table "
                                       f"{table.name!r}; at most {self.max_held_samples}")
        timeout_ms = msg.get("timeout_ms")
        timeout_ms = MAX_SAMPLE_TIMEOUT_MS if timeout_ms is None else min(timeout_ms, MAX_SAMPLE_TIMEOUT_MS)
        now = time.monotonic()
        (held if limited else unlimited).append(HeldSample(peer, bs, beta, now + timeout_ms / 1000, now, limited))
        self._pump(table)

    def on_priorities(self, peer: Peer, msg: Message) -> None:
        table = self._table(msg["table"])
        keys, prio = msg.arrays["key"], msg.arrays["priority"]
        if keys.shape != prio.shape:
            raise RequestError("bad_request", f"{len(keys)} keys but {len(prio)} priorities")
        try:
            check_priorities(prio)
        except TableError as exc:
            raise RequestError(exc.reason, exc.detail) from None
        before = table.ignored_updates
        updated = table.update_priorities(keys, prio.astype(np.float64))
        self.m_ignored.labels(table.name).inc(table.ignored_updates - before)
        self.reply(peer, Message("priorities_ack", {"updated": updated}))

    def on_info(self, peer: Peer, msg: Message) -> None:
        self.reply(peer, Message("info_reply", {"service": "replay", "shard": self.shard, "stats": self.stats()}))

    def stats(self) -> dict[str, Any]:
        tables = {}
        for name, t in self.tables.items():
            tables[name] = {**t.stats(), "held_inserts": len(self.held_inserts[name]),
                            "held_samples": len(self.held_samples[name]) + len(self.held_unlimited[name])}
        return {
            "tables": tables,
            "duplicates": self.duplicates,
            "fast_inserts": self.fast_inserts,
            "senders": len(self.dedup),
            "durability": self.durability,
            "snapshots": self.snapshotter.count if self.snapshotter else 0,
            "wal_syncs": self.wal.syncs if self.wal else 0,
        }

    # -- timers ---------------------------------------------------------------
    def tick(self) -> None:
        self.flush_acks()
        now = time.monotonic()
        for held in (*self.held_samples.values(), *self.held_unlimited.values()):
            if held and any(h.deadline <= now for h in held):
                keep: deque[HeldSample] = deque()
                for h in held:
                    if h.deadline <= now:
                        self.m_wait.labels("sample").inc(now - h.since)
                        self.reply_error(h.peer, "timeout", "the rate limiter held this sample past its timeout_ms",
                                         count=False)
                    else:
                        keep.append(h)
                held.clear()
                held.extend(keep)
        for name, t in self.tables.items():
            self._m_size[name].set(t.size)
        self._m_held_inserts.set(sum(map(len, self.held_inserts.values())))
        self._m_held_samples.set(sum(map(len, (*self.held_samples.values(), *self.held_unlimited.values()))))
        if (self.durability != "memory" and now - self.last_snapshot >= self.cfg.checkpoint_every_s
                and self.snapshotter is not None and not self.snapshotter.busy):
            self.snapshot()

    # -- durability -----------------------------------------------------------
    def snapshot(self, wait: bool = False) -> None:
        """Copy every table now (in the loop thread); write the copy in a thread."""
        if self.snapshotter is None:
            return
        self.snapshotter.wait()
        self.last_snapshot = time.monotonic()
        start_snapshot(self.snapshotter, self.wal, self.shard, self.tables, self.dedup)
        if wait:
            self.snapshotter.wait()
        self.m_snap.set(self.snapshotter.last_seconds)

    def restore(self) -> int:
        """Load the snapshot and replay the log; returns the items restored."""
        if self.dir is None or self.durability == "memory":
            return 0
        restore_tables(self.dir, self.wal, self.shard, self.tables, self.dedup)
        for name, t in self.tables.items():
            self.m_size.labels(name).set(t.size)
        return sum(t.size for t in self.tables.values())

    def close(self) -> None:
        for t in self.tables.values():
            t.close()
        if self.snapshotter is not None:
            self.snapshotter.wait()
        if self.wal is not None:
            self.wal.close()
        super().close()
