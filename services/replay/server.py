"""The replay server: a ROUTER loop over tables, composed of parts that each own their state.

The loop (:class:`rlfleet.common.wire.server.Server`) decodes and dispatches; the
handlers here check requests and hand them to the parts, which the server
builds and wires explicitly:

- :class:`~rlfleet.services.replay.burst_replies.BurstReplies`: the acks and held-back
  queue batches of a burst, sent after it (after its fsync with ``wal``);
- :class:`~rlfleet.services.replay.insert_writer.InsertWriter`: a checked insert into
  the log, its table and dedup, its ack queued;
- :class:`~rlfleet.services.replay.sample_responder.SampleResponder`: a sample the
  limiter let go, answered with a batch;
- :class:`~rlfleet.services.replay.held_requests.HeldRequests`: what the rate limiter
  holds (inserts and samples), stored and answered when it may go;
- :class:`~rlfleet.services.replay.fast_insert.FastInsertPath`: the usual inserts of
  a connection stored from their frames, without a full decode;
- :class:`~rlfleet.services.replay.recovery.Recovery`: snapshots and the restore from
  the snapshot and the log;
- :class:`~rlfleet.common.wire.dedup.Dedup`: which (sender, seq) are stored.

A sample's ``timeout_ms`` is capped at ``MAX_SAMPLE_TIMEOUT_MS`` (10 minutes),
which is also the wait of a sample without one.

Exactly-once: an insert whose (sender, seq) is already stored is acked again
with ``duplicate=true, stored=0``. With ``wal`` durability every stored
insert is appended to the log before it is stored, and acked only after the
log is fsync'ed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from rlfleet.common.config import ReplayConfig
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import DEFAULT_LIMITS, Limits, Message
from rlfleet.common.wire.dedup import Dedup
from rlfleet.common.wire.errors import RequestError
from rlfleet.common.wire.server import Peer, Server
from rlfleet.common.wire.transport import DEFAULT_HWM, CurveConfig
from rlfleet.services.replay.burst_replies import BurstReplies
from rlfleet.services.replay.columnar import Table, TableError
from rlfleet.services.replay.fast_insert import FastInsertPath, StoredPacked
from rlfleet.services.replay.held_requests import MAX_HELD_BYTES, MAX_HELD_INSERTS, MAX_HELD_SAMPLES, HeldRequests
from rlfleet.services.replay.insert_writer import InsertWriter
from rlfleet.services.replay.metrics import ReplayMetrics
from rlfleet.services.replay.priorities import check_priorities
from rlfleet.services.replay.recovery import Recovery
from rlfleet.services.replay.sample_responder import SampleResponder
from rlfleet.services.replay.storage import WriteAheadLog
from rlfleet.services.replay.tables import QueueTable, make_table
from rlfleet.services.replay.versions import DEFER, PublishedVersions

RESERVED = ("key", "probability", "priority")
MAX_SAMPLE_TIMEOUT_MS = 600_000  # a held sample waits at most this long (also without timeout_ms)


class ReplayServer(Server):
    """A replay shard: its tables and dedup, the request handlers, and the parts they hand requests to."""

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
        paramserver: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``paramserver``: the address of paramserver shard 0, which replay asks for the newest version
        an insert may claim (services/replay/versions.py); None: only negative versions are refused.
        ``clock``: the seconds by which the dedup tells a silent sender (tests pass a fake one)."""
        self.dir = Path(directory) if directory is not None else None
        if cfg.durability != "memory" and self.dir is None:  # before the socket is bound: nothing to close
            raise ValueError(f"durability={cfg.durability} needs a directory")
        super().__init__(metrics, bind, limits=limits, curve=curve, hwm=hwm, ctx=ctx)
        self.cfg = cfg
        self.shard = shard
        self.durability = cfg.durability
        rng = np.random.default_rng(seed)
        self.tables: dict[str, Table] = {t.name: make_table(t, rng) for t in cfg.tables}
        self.dedup = Dedup(clock=clock)
        self.duplicates = 0  # insert messages already stored or held, dropped
        self.replay_metrics = m = ReplayMetrics(metrics, self.tables)
        self.wal = WriteAheadLog(self.dir) if self.durability == "wal" and self.dir is not None else None
        self.replies = BurstReplies(self, self.wal, m.table_inserts)
        self.writer = InsertWriter(self.wal, self.dedup, self.replies, m.wal_failed_insert)
        self.responder = SampleResponder(self, self.wal, self.replies, shard, m)
        self.held = HeldRequests(self.tables, self.writer, self.responder, self, m, max_inserts=max_held_inserts,
                                 max_samples=max_held_samples, max_bytes=max_held_bytes)
        self.versions = PublishedVersions(paramserver, f"replay-{shard}/versions", ctx=ctx)
        if self.versions.socket is not None:  # shard 0's answers wake the loop: inserts set aside for them go on
            self.watched.append(self.versions.socket)
        self.fast_path = FastInsertPath(self, self.dedup, self.held, self.writer, self.replies, self.versions,
                                        logged=self.wal is not None)
        self.recovery = Recovery(self.dir, self.durability, cfg.checkpoint_every_s, self.wal, shard, self.tables,
                                 self.dedup, m.snapshot_seconds)
        self.route("insert", self.on_insert)
        self.route("sample", self.on_sample)
        self.route("priorities", self.on_priorities)
        self.route("info", self.on_info)

    @property
    def fast_inserts(self) -> int:
        """Inserts stored from their frames (in ``info``'s stats)."""
        return self.fast_path.inserts

    # -- the loop -------------------------------------------------------------
    def handle_frames(self, frames: list[Any]) -> None:
        """The fast path takes the usual inserts of a connection; any other message, and any insert
        it does not take, is decoded and handled in full, then shown to it to learn from."""
        if self.versions.deferred:
            self._release_deferred()
        fast_path = self.fast_path
        if fast_path.take(frames):
            return
        super().handle_frames(frames)
        fast_path.learn(frames)

    def _release_deferred(self) -> None:
        """Handle again, in order, the inserts set aside for paramserver shard 0's newest version, once
        it answered (or did not in time): judged now, never set aside again."""
        released = self.versions.released()
        if not released:
            return
        self.versions.deciding = True
        try:
            for peer, msg in released:
                self.run_handler(self.on_insert, peer, msg)
        finally:
            self.versions.deciding = False
            self.fast_path.learn([])  # no layout is learnt from them: their frames are not at hand

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
        problem = table.value_problem(arrays) or self.versions.problem(arrays)
        if problem is DEFER:  # it claims a version newer than replay knows: it waits for shard 0's answer,
            self.versions.defer((peer, msg), sum(a.nbytes for a in msg.arrays.values()))  # the loop does not
            return
        if problem is not None:
            raise RequestError("bad_value", problem)
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
        held = self.held
        if held.keys and (sender, seq) in held.keys:
            self._duplicate(table, peer, acked=False, merge=merge)
            return
        ws = msg.body.get("window_start")
        ws = ws if isinstance(ws, int) else None
        if not held.inserts[table.name] and table.can_insert(n):  # nothing queued ahead, the limiter admits it
            self.writer.commit(table, peer, arrays, priority, ws, n, merge)
            if layout is not None and merge:
                self.fast_path.remember(StoredPacked(table, layout, n, peer, ws))
            if held.samples[table.name] or held.unlimited[table.name]:
                held.pump(table)
            return
        held.hold_insert(table, peer, arrays, priority, ws, n, merge)

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
        self.replay_metrics.duplicates.labels(table.name).inc()
        if acked:
            self.replies.ack_duplicate(peer.identity, peer.seq, peer.sender, merge)

    def on_sample(self, peer: Peer, msg: Message) -> None:
        table = self._table(msg["table"])
        bs = msg["batch_size"]  # in 1..65,536: the decoder checks
        limited = msg.get("rate_limited") is not False
        if not limited and isinstance(table, QueueTable):
            raise RequestError("bad_request", f"rate_limited=false on queue table {table.name!r}: its items are "
                                              "removed when sampled; allowed: only on uniform and prioritized tables")
        timeout_ms = msg.get("timeout_ms")
        timeout_ms = MAX_SAMPLE_TIMEOUT_MS if timeout_ms is None else min(timeout_ms, MAX_SAMPLE_TIMEOUT_MS)
        self.held.hold_sample(table, peer, bs, timeout_ms / 1000, limited)

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
        self.replay_metrics.ignored.labels(table.name).inc(table.ignored_updates - before)
        self.reply(peer, Message("priorities_ack", {"updated": updated}))

    def on_info(self, peer: Peer, msg: Message) -> None:
        # first_seq: where the asking sender's insert seqs start (common/wire/dedup.py), not a clock's word
        stats = {**self.stats(), "first_seq": self.dedup.first_seq(msg.sender)}
        self.reply(peer, Message("info_reply", {"service": "replay", "shard": self.shard, "stats": stats}))

    def stats(self) -> dict[str, Any]:
        tables = {}
        for name, t in self.tables.items():
            tables[name] = {**t.stats(), "held_inserts": len(self.held.inserts[name]),
                            "held_samples": self.held.held_samples(name)}
        return {
            "tables": tables,
            "duplicates": self.duplicates,
            "fast_inserts": self.fast_path.inserts,
            "senders": len(self.dedup),
            "durability": self.durability,
            "snapshots": self.recovery.snapshots,
            "wal_syncs": self.wal.syncs if self.wal else 0,
            "version_asks": self.versions.asks,
            "version_deferred": self.versions.deferred_total,
        }

    # -- timers ---------------------------------------------------------------
    def tick(self) -> None:
        self.versions.poll()  # reads every answer of shard 0 (else its socket would wake the loop again at once)
        if self.versions.deferred:
            self._release_deferred()
        self.replies.flush()
        now = time.monotonic()
        self.held.expire(now)
        for name, t in self.tables.items():
            self.replay_metrics.table_size[name].set(t.size)
        self.held.export()
        if self.recovery.due(now):
            self.recovery.snapshot()

    # -- durability -----------------------------------------------------------
    def snapshot(self, wait: bool = False) -> None:
        """Copy every table now (in the loop thread); write the copy in a thread."""
        self.recovery.snapshot(wait)

    def restore(self) -> int:
        """Load the snapshot and replay the log; returns the items restored."""
        restored = self.recovery.restore()
        if restored:
            for name, t in self.tables.items():
                self.replay_metrics.table_size[name].set(t.size)
        return restored

    def close(self) -> None:
        self.versions.close()
        for t in self.tables.values():
            t.close()
        self.recovery.wait()
        if self.wal is not None:
            self.wal.close()
        super().close()
