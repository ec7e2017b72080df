"""The replay server: a ROUTER loop over tables, with held inserts and held samples.

Rate limiting holds requests instead of refusing them:

- An insert the limiter does not admit yet (actors ahead of the learner) or
  that does not fit a full queue table waits in a FIFO per table, *not
  stored*; it is stored and acked together when the limiter admits it, as in
  Reverb where the insert call itself blocks. The actor's window of un-acked
  inserts fills up and its ``insert()`` blocks: that is the back-pressure.
  A resend of a held insert is dropped (it is already queued); its one ack
  comes when it is stored. Beyond ``max_held_inserts`` (10,000) held per
  table, an insert is dropped without a reply (counted in
  ``rlfleet_replay_inserts_dropped_total``); its sender resends it later.
- A sample the limiter does not admit (learner ahead, or the table below
  ``min_size``) is held and answered when it may go, or with an ``error``
  of reason ``timeout`` (not counted as a protocol error: it is an expected
  outcome) once its ``timeout_ms`` passes. ``timeout_ms`` is capped at
  ``MAX_SAMPLE_TIMEOUT_MS`` (10 minutes), which is also the wait of a sample
  without one. Beyond ``max_held_samples`` (1,000) held per table a sample
  is refused at once with reason ``busy``. A held sample of a queue table
  pops its items when it is answered, even if the learner that asked has
  gone meanwhile: those items are lost.

Exactly-once: an insert whose (sender, seq) is already stored is acked again
with ``duplicate=true, stored=0``. With ``wal`` durability every stored
insert is appended to the log, and the acks of a burst of messages are sent
only after the log is fsync'ed (in :meth:`ReplayServer.tick`, which the loop
runs after every burst). Batches of queue tables are held back the same way
until the log holding their pop is fsync'ed, so a batch the learner got is
never served again after a crash. The inserts of a burst that asked for it
(``merge_acks``, as InsertClient does) are acked with one message per sender:
a message per ack costs the server a send and the sender a receive and a
decode each, which was a fifth of the cost of an insert.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from common.config import ReplayConfig
from common.metrics import ServiceMetrics
from common.wire.codec import DEFAULT_LIMITS, DTYPES, Limits, Message, encode_header
from common.wire.decoder import PackedLayout
from common.wire.errors import RequestError
from common.wire.inserts import insert_header_prefix, read_insert_tail
from common.wire.server import Peer, Server
from common.wire.transport import DEFAULT_HWM, CurveConfig
from services.replay.dedup import Dedup
from services.replay.storage import SNAPSHOT, Snapshotter, WalError, WriteAheadLog, read_snapshot
from services.replay.tables import (
    MAX_SAMPLE_BATCH,
    PackedPlan,
    QueueTable,
    Table,
    TableError,
    check_priorities,
    make_table,
)

log = logging.getLogger(__name__)

RESERVED = ("key", "probability", "weight", "priority")
MAX_HELD_INSERTS = 10_000  # per table; beyond, inserts are dropped unacked and the client resends
MAX_HELD_SAMPLES = 1_000  # per table; beyond, samples are refused with reason 'busy'
ACKS_PER_MESSAGE = 200  # inserts one ack message answers at most (a header list holds at most 256 items)
MAX_SAMPLE_TIMEOUT_MS = 600_000  # a held sample waits at most this long (also without timeout_ms)
MAX_FAST_PEERS = 4096  # connections whose insert header prefix is remembered (all forgotten beyond)


@dataclass
class HeldInsert:
    peer: Peer
    arrays: dict[str, np.ndarray]
    priority: np.ndarray | None
    window_start: int | None
    n: int
    since: float
    merge_acks: bool = False


@dataclass
class FastInsert:
    """What the server checked of one connection's inserts: their header up to window_start
    (``prefix``), the packed layout after it and how its payload goes into the table."""

    prefix: bytes
    table: Table
    generation: int  # the table's columns it was checked against and copies into
    n: int
    nbytes: int  # of the payload frame
    sender: str
    plan: PackedPlan
    items: tuple[tuple[str, np.dtype[Any], tuple[int, ...], int], ...]  # the decoder's, priority included
    priority: tuple[np.dtype[Any], int] | None  # its dtype and offset in the payload


@dataclass
class HeldSample:
    peer: Peer
    batch_size: int
    beta: float | None
    deadline: float
    since: float


class ReplayServer(Server):
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
    ) -> None:
        super().__init__(metrics, bind, limits=limits, curve=curve, hwm=hwm, ctx=ctx)
        self.cfg = cfg
        self.max_held_inserts = max_held_inserts
        self.max_held_samples = max_held_samples
        self.shard = shard
        rng = np.random.default_rng(seed)
        self.tables: dict[str, Table] = {t.name: make_table(t, rng) for t in cfg.tables}
        self.dedup = Dedup()
        self.held_inserts: dict[str, deque[HeldInsert]] = {n: deque() for n in self.tables}
        self.held_keys: set[tuple[str, int]] = set()
        self.held_samples: dict[str, deque[HeldSample]] = {n: deque() for n in self.tables}
        # sent after the burst (with wal, after its fsync): queue batches, and acks by sender
        # identity (merge_acks) or by (identity, seq)
        self.deferred: list[tuple[Peer, list[Any], str]] = []
        # by ROUTER identity: the usual inserts of that connection, taken without a full decode
        self.fast: dict[bytes, FastInsert] = {}
        self.fast_inserts = 0  # inserts stored by _insert_fast
        self._learn_failed = False
        # by identity: the layout of the connection's last insert that took the full path; a layout
        # is learnt the second time in a row (a sender whose N changes every insert learns nothing)
        self._full_layouts: dict[bytes, PackedLayout] = {}
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
        self.m_dropped = m.counter("replay_inserts_dropped", "Inserts dropped unacked: too many held.")
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
        if self.dedup.seen(sender, seq):
            self._duplicate(table, peer, acked=True, merge=merge)
            return
        if self.held_keys and (sender, seq) in self.held_keys:
            self._duplicate(table, peer, acked=False, merge=merge)
            return
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
        ws = msg.body.get("window_start")
        ws = ws if isinstance(ws, int) else None
        held = self.held_inserts[table.name]
        if not held and table.can_insert(n):  # nothing queued ahead and the limiter admits it: store now
            self._commit(table, peer, arrays, priority, ws, n, merge)
            if layout is not None and merge:
                self._stored_packed = (table, layout, n, peer, ws)
            if self.held_samples[table.name]:
                self._pump(table)
            return
        if len(held) >= self.max_held_inserts:
            self.m_dropped.inc()
            return
        held.append(HeldInsert(peer, arrays, priority, ws, n, time.monotonic(), merge))
        self.held_keys.add((sender, seq))
        self._pump(table)

    # -- inserts without a full decode ----------------------------------------
    def handle_frames(self, frames: list[Any]) -> None:
        """An insert of a connection whose last inserts were all alike but for seq and window_start
        (as InsertClient sends them) is stored from its frames by :meth:`_insert_fast`; any other
        message, and any insert that path does not take, is decoded and handled in full."""
        if len(frames) == 3:
            identity = frames[0].bytes
            fast = self.fast.get(identity)
            if fast is not None:
                try:
                    if self._insert_fast(fast, identity, frames):
                        return
                except Exception as exc:  # answered as the full path does
                    tail = read_insert_tail(frames[1].bytes, len(fast.prefix))
                    peer = Peer(identity, tail[1] if tail is not None else -1, fast.sender)
                    if isinstance(exc, RequestError):  # e.g. wal_failed: the wal's disk is full
                        self.reply_error(peer, exc.reason, exc.detail, count=exc.count)
                        return
                    self.fast.pop(identity, None)
                    log.exception("%s: insert failed", self.name)
                    self.reply_error(peer, "internal", f"{type(exc).__name__}: {exc}")
                    return
        self._stored_packed = None
        super().handle_frames(frames)
        if self._stored_packed is not None and len(frames) == 3:
            try:
                self._learn_fast(frames)
            except Exception:  # a layout the fast path cannot take: its inserts keep the full path
                self._stored_packed = None
                if not self._learn_failed:  # once: the same layout would fail at every insert
                    self._learn_failed = True
                    log.exception("%s: insert layout not memoised (its inserts take the full path)", self.name)

    def _learn_fast(self, frames: list[Any]) -> None:
        """After a packed insert passed the full decode and was stored: remember its header's bytes
        up to window_start, if they are in InsertEncoder's form, for the next ones."""
        stored = self._stored_packed
        self._stored_packed = None
        assert stored is not None
        table, layout, n, peer, ws = stored
        identity = frames[0].bytes
        if self._full_layouts.get(identity) != layout:  # by value: the decoder may rebuild equal layouts
            if len(self._full_layouts) >= MAX_FAST_PEERS:
                self._full_layouts.clear()
            self._full_layouts[identity] = layout
            return
        items, nbytes = layout
        descriptors: list[Any] = []
        for name, dtype, shape, _ in items:
            if DTYPES.get(dtype.name) != dtype:
                return
            descriptors.append([name, dtype.name, list(shape)])
        header = frames[1].bytes
        prefix = insert_header_prefix(table.name, peer.sender, descriptors)
        if not header.startswith(prefix) or read_insert_tail(header, len(prefix)) != (ws, peer.seq):
            return
        plan = table.packed_plan(items)
        if plan is None:
            return
        priority = next(((dtype, offset) for name, dtype, _, offset in items if name == "priority"), None)
        if len(self.fast) >= MAX_FAST_PEERS:
            self.fast.clear()
        self.fast[identity] = FastInsert(prefix, table, table.generation, n, nbytes, peer.sender, plan, items, priority)

    def _insert_fast(self, fast: FastInsert, identity: bytes, frames: list[Any]) -> bool:
        """Store an insert whose header is ``fast.prefix`` and two ints and whose payload has the
        size of that layout; False (nothing done) for anything else: a duplicate, a held insert,
        a bad priority, another header, ... all take the full path."""
        header, payload = frames[1].bytes, frames[2]
        table = fast.table
        prefix = fast.prefix
        if (len(payload) != fast.nbytes or not header.startswith(prefix) or table.generation != fast.generation
                or len(header) > self.limits.max_header_bytes
                or len(header) + fast.nbytes > self.limits.max_message_bytes):
            return False
        tail = read_insert_tail(header, len(prefix))
        if tail is None:
            return False
        ws, seq = tail
        sender, n = fast.sender, fast.n
        if (self.dedup.seen(sender, seq) or (self.held_keys and (sender, seq) in self.held_keys)
                or self.held_inserts[table.name] or not table.can_insert(n)):
            return False
        priority = None
        if fast.priority is not None:
            dtype, offset = fast.priority
            priority = np.ndarray((n,), dtype, memoryview(payload).toreadonly(), offset)
            try:
                check_priorities(priority)
            except TableError:
                return False
        self.count("insert", "in", len(header) + fast.nbytes)
        if self.wal is None:
            table.insert_packed(fast.plan, payload, n, priority)
            self._stored(table, identity, seq, sender, ws, n, True)
        else:  # the log takes arrays
            view = memoryview(payload).toreadonly()
            arrays = {name: np.ndarray(shape, dtype, view, offset)
                      for name, dtype, shape, offset in fast.items if name != "priority"}
            self._commit(table, Peer(identity, seq, sender), arrays, priority, ws, n, True)
        self.fast_inserts += 1
        if self.held_samples[table.name]:
            self._pump(table)
        return True

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

    def _defer(self, peer: Peer, msg: Message) -> None:
        # Acks (and queue batches under wal) go out together after each burst of messages
        # (tick), for wal after the burst's fsync; replies sent back to back also wake
        # ZeroMQ's I/O thread less often. They are encoded now so that the sends are back to back.
        self.deferred.append((peer, self.reply_frames(peer, msg), msg.type))

    def _defer_ack(self, identity: bytes, seq: int, sender: str, stored: int, duplicate: bool, merge: bool) -> None:
        # inserts that asked for merged acks share one ack per sender and burst; others get one each
        # (a Peer, where the ack goes, only for the first of them: the fast path makes none)
        key = identity if merge else (identity, seq)
        pending = self.acks.get(key)
        if pending is None:
            self.acks[key] = (Peer(identity, seq, sender), [(seq, stored, duplicate)])
        else:
            pending[1].append((seq, stored, duplicate))

    def on_sample(self, peer: Peer, msg: Message) -> None:
        table = self._table(msg["table"])
        bs = msg["batch_size"]
        if not 1 <= bs <= MAX_SAMPLE_BATCH:
            raise RequestError("bad_request", f"batch_size={bs}; allowed: 1..{MAX_SAMPLE_BATCH}")
        beta = msg.get("beta")
        if beta is not None and not 0 <= beta <= 100:
            raise RequestError("bad_request", f"beta={beta}; allowed: 0..100")
        held = self.held_samples[table.name]
        if len(held) >= self.max_held_samples:
            raise RequestError("busy", f"{len(held)} samples already held on table {table.name!r}; "
                                       f"at most {self.max_held_samples}")
        timeout_ms = msg.get("timeout_ms")
        timeout_ms = MAX_SAMPLE_TIMEOUT_MS if timeout_ms is None else min(timeout_ms, MAX_SAMPLE_TIMEOUT_MS)
        now = time.monotonic()
        held.append(HeldSample(peer, bs, beta, now + timeout_ms / 1000, now))
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
                            "held_samples": len(self.held_samples[name])}
        return {
            "tables": tables,
            "duplicates": self.duplicates,
            "fast_inserts": self.fast_inserts,
            "senders": len(self.dedup),
            "durability": self.durability,
            "snapshots": self.snapshotter.count if self.snapshotter else 0,
            "wal_syncs": self.wal.syncs if self.wal else 0,
        }

    # -- the limiter's queues -------------------------------------------------
    def _pump(self, table: Table) -> None:
        """Store held inserts and serve held samples while the limiter lets them go."""
        inserts, samples = self.held_inserts[table.name], self.held_samples[table.name]
        progress = True
        while progress:
            progress = False
            while inserts and table.can_insert(inserts[0].n):
                self._store(table, inserts.popleft())
                progress = True
            while samples and table.can_sample():
                self._serve(table, samples.popleft())
                progress = True

    def _store(self, table: Table, h: HeldInsert) -> None:
        self.held_keys.discard((h.peer.sender, h.peer.seq))
        try:
            self._commit(table, h.peer, h.arrays, h.priority, h.window_start, h.n, h.merge_acks)
        except RequestError as exc:  # wal_failed: its sender is told, not whoever's request pumped it
            self.reply_error(h.peer, exc.reason, exc.detail, count=exc.count)
        self._m_wait_insert.inc(time.monotonic() - h.since)

    def _commit(self, table: Table, peer: Peer, arrays: dict[str, np.ndarray], priority: np.ndarray | None,
                window_start: int | None, n: int, merge_acks: bool) -> None:
        """Log a checked insert (wal), store it, remember its (sender, seq) and queue its ack.

        Logged first: an insert the log refuses (disk full) is not stored either, so its resend
        is stored once; the sender is answered ``wal_failed`` (RequestError)."""
        if self.wal is not None:
            logged = arrays if priority is None else {**arrays, "__priority__": priority}
            try:
                self.wal.append_insert(table.name, table.next_key, logged, peer.sender, peer.seq, window_start)
            except WalError as exc:  # counted in replay_wal_failures, not as a protocol error
                self.m_wal_failed.labels("insert").inc()
                raise RequestError("wal_failed", f"insert not stored: {exc}; nothing of it was stored, "
                                                 "send it again later", count=False) from None
        table.insert(arrays, priority, n)
        self._stored(table, peer.identity, peer.seq, peer.sender, window_start, n, merge_acks)

    def _stored(self, table: Table, identity: bytes, seq: int, sender: str, window_start: int | None, n: int,
                merge_acks: bool) -> None:
        """After an insert is stored (and logged): remember its (sender, seq), count it, queue its ack."""
        self.dedup.add(sender, seq, window_start)
        self._inserted[table.name] += n
        self._defer_ack(identity, seq, sender, n, False, merge_acks)

    def _serve(self, table: Table, h: HeldSample) -> None:
        size = table.size
        popped = self.wal is not None and isinstance(table, QueueTable)
        if popped:
            # the pop goes on disk before the items leave the queue; the log refusing it (disk full)
            # leaves them queued and the learner is told to ask again
            assert self.wal is not None
            try:
                self.wal.append_pop(table.name, table.oldest_key + min(h.batch_size, size))
            except WalError as exc:
                self.m_wal_failed.labels("pop").inc()
                self.reply_error(h.peer, "wal_failed", f"sample not served: {exc}; the items stay queued, ask again "
                                                       "later", count=False)
                return
        s = table.sample(h.batch_size, h.beta)
        self.m_samples.labels(table.name).inc(len(s.keys))
        self.m_wait.labels("sample").inc(time.monotonic() - h.since)
        arrays = {"key": s.keys, "probability": s.probability, "weight": s.weight, **s.data}
        body = {"table": table.name, "shard": self.shard, "table_size": size}
        batch = Message("batch", body, arrays)
        if popped:  # sent with the burst's acks, after the fsync of its pop
            self._defer(h.peer, batch)
        else:
            self.reply(h.peer, batch)

    # -- timers ---------------------------------------------------------------
    def tick(self) -> None:
        self.flush_acks()
        now = time.monotonic()
        for held in self.held_samples.values():
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
        self._m_held_samples.set(sum(map(len, self.held_samples.values())))
        if (self.durability != "memory" and now - self.last_snapshot >= self.cfg.checkpoint_every_s
                and self.snapshotter is not None and not self.snapshotter.busy):
            self.snapshot()

    def flush_acks(self) -> None:
        """Send the acks (and queue batches) of this burst (wal: after fsync'ing what it appended)."""
        for name, n in self._inserted.items():  # counted before the acks go: an acked insert is counted
            if n:
                self._m_inserts[name].inc(n)
                self._inserted[name] = 0
        if self.wal is not None:
            self.wal.sync()
        acks, self.acks = self.acks, {}
        for peer, items in acks.values():  # one ack message per sender and burst
            for i in range(0, len(items), ACKS_PER_MESSAGE):
                (seq, stored, duplicate), *more = items[i:i + ACKS_PER_MESSAGE]
                body: dict[str, Any] = {"stored": stored, "duplicate": duplicate, "ref_seq": seq}
                if more:
                    body["more"] = more  # [seq, stored, duplicate] of each further insert
                self.send_frames(peer, [encode_header("ack", body, self.name, next(self.seq))], "ack")
        replies, self.deferred = self.deferred, []
        for peer, frames, mtype in replies:
            self.send_frames(peer, frames, mtype)

    # -- durability -----------------------------------------------------------
    def snapshot(self, wait: bool = False) -> None:
        """Copy every table now (in the loop thread); write the copy in a thread."""
        if self.snapshotter is None:
            return
        self.snapshotter.wait()
        self.last_snapshot = time.monotonic()
        covered = self.wal.rotate() if self.wal is not None else 0
        index: dict[str, Any] = {"format": 1, "shard": self.shard, "time": time.time(), "wal_segment": covered,
                                 "dedup": self.dedup.state(), "tables": {}}
        arrays: dict[str, np.ndarray] = {}
        for name, t in self.tables.items():
            meta, arrs = t.state()
            index["tables"][name] = meta
            arrays.update({f"{name}/{col}": a for col, a in arrs.items()})
        wal = self.wal
        then = (lambda: wal.drop_through(covered)) if wal is not None else None
        self.snapshotter.start(index, arrays, then)
        if wait:
            self.snapshotter.wait()
        self.m_snap.set(self.snapshotter.last_seconds)

    def restore(self) -> int:
        """Load the snapshot and replay the log; returns the items restored."""
        if self.dir is None or self.durability == "memory":
            return 0
        covered = 0
        path = self.dir / SNAPSHOT
        if path.exists():
            index, arrays = read_snapshot(path)
            for name, meta in index["tables"].items():
                table = self.tables.get(name)
                if table is None:
                    log.warning("replay shard %d: snapshot table %r is not configured; skipped", self.shard, name)
                    continue
                prefix = f"{name}/"
                table.restore(meta, {k[len(prefix):]: a for k, a in arrays.items() if k.startswith(prefix)})
            self.dedup.restore(index.get("dedup", {}))
            covered = int(index.get("wal_segment", 0))
        if self.wal is not None:
            for header, arrays in self.wal.replay(covered, self.wal.segment):
                self._apply(header, arrays)
        for name, t in self.tables.items():
            if not isinstance(t, QueueTable):  # a queue's pops are logged; other samples are not
                t.limiter.resume()
            self.m_size.labels(name).set(t.size)
        return sum(t.size for t in self.tables.values())

    def _apply(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        table = self.tables.get(header["table"])
        if table is None:
            return
        if header["op"] == "pop":
            gone = min(table.size, max(0, int(header["head"]) - table.oldest_key))
            table.size -= gone
            table.limiter.sampled(gone)
            return
        priority = arrays.pop("__priority__", None)
        n = len(next(iter(arrays.values())))
        key = int(header["key"])
        if key + n > table.next_key:
            if key != table.next_key:
                log.warning("replay: log of table %r jumps from key %d to %d", table.name, table.next_key, key)
                table.next_key, table.size = key, 0
            table.insert(arrays, priority)
        self.dedup.add(header["sender"], int(header["seq"]), header.get("ws"))

    def close(self) -> None:
        for t in self.tables.values():
            t.close()
        if self.snapshotter is not None:
            self.snapshotter.wait()
        if self.wal is not None:
            self.wal.close()
        super().close()
