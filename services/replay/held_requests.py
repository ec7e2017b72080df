"""Requests the replay rate limiter holds, and the replies sent after each burst.

Rate limiting holds requests instead of refusing them:

- An insert the limiter does not admit yet (actors ahead of the learner) or
  that does not fit a full queue table waits in a FIFO per table, *not
  stored*; it is stored and acked together when the limiter admits it, as in
  Reverb where the insert call itself blocks. The actor's window of un-acked
  inserts fills up and its ``insert()`` blocks: that is the back-pressure.
  A resend of a held insert is dropped (it is already queued); its one ack
  comes when it is stored. Beyond ``max_held_inserts`` (10,000) held per
  table, or ``max_held_bytes`` (256 MiB) held in all, an insert is dropped
  without a reply (counted in ``rlfleet_replay_inserts_dropped_total``); its
  sender resends it later.
- A sample the limiter does not admit (learner ahead, or the table below
  ``min_size``) is held and answered when it may go, or with an ``error``
  of reason ``timeout`` (not counted as a protocol error: it is an expected
  outcome) once its ``timeout_ms`` passes. Beyond ``max_held_samples``
  (1,000) held per table a sample is refused at once with reason ``busy``.
  A held sample of a queue table pops its items when it is answered, even
  if the learner that asked has gone meanwhile: those items are lost.
- A sample sent with ``rate_limited: false`` (a second consumer of the
  table, such as a world-model learner) waits only for ``min_size``, in a
  queue of its own so that it never waits behind a sample the limiter holds,
  and its items are not counted by the limiter: the limiter's state is as if
  it had not been asked.

With ``wal`` durability every stored insert is appended to the log, and the
acks of a burst of messages are sent only after the log is fsync'ed
(:meth:`HeldRequestServer.flush_acks`, which the loop's tick runs after every
burst). Batches of queue tables are held back the same way until the log
holding their pop is fsync'ed, so a batch the learner got is never served
again after a crash. The inserts of a burst that asked for it
(``merge_acks``, as InsertClient does) are acked with one message per sender:
a message per ack costs the server a send and the sender a receive and a
decode each, which was a fifth of the cost of an insert.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.wire.codec import Message, encode_header
from common.wire.dedup import Dedup
from common.wire.errors import RequestError
from common.wire.server import Peer, Server
from services.replay.columnar import Table
from services.replay.storage import WalError, WriteAheadLog
from services.replay.tables import QueueTable

MAX_HELD_INSERTS = 10_000  # per table; beyond, inserts are dropped unacked and the client resends
MAX_HELD_BYTES = 256 << 20  # all tables: the arrays held inserts keep alive; beyond, dropped the same way
MAX_HELD_SAMPLES = 1_000  # per table; beyond, samples are refused with reason 'busy'
ACKS_PER_MESSAGE = 200  # inserts one ack message answers at most (a header list holds at most 256 items)


@dataclass
class HeldInsert:
    peer: Peer
    arrays: dict[str, np.ndarray]
    priority: np.ndarray | None
    window_start: int | None
    n: int
    since: float
    merge_acks: bool = False
    nbytes: int = 0  # of its arrays and priorities (what holding it keeps in memory)


@dataclass
class HeldSample:
    peer: Peer
    batch_size: int
    beta: float | None
    deadline: float
    since: float
    rate_limited: bool = True  # False: waits for min_size only, not counted by the limiter


class HeldRequestServer(Server):
    """A server that holds the inserts and samples its tables' limiters do not admit yet, stores
    and serves them when they may go, and sends the acks (and queue batches) of each burst together.

    Its state is set up by :class:`services.replay.server.ReplayServer`."""

    tables: dict[str, Table]
    dedup: Dedup
    wal: WriteAheadLog | None
    shard: int
    held_inserts: dict[str, deque[HeldInsert]]
    held_bytes: int
    held_keys: set[tuple[str, int]]
    held_samples: dict[str, deque[HeldSample]]
    held_unlimited: dict[str, deque[HeldSample]]  # samples sent with rate_limited false
    deferred: list[tuple[Peer, list[Any], str]]
    acks: dict[Any, tuple[Peer, list[tuple[int, int, bool]]]]
    _inserted: dict[str, int]
    _m_inserts: dict[str, Any]
    _m_wait_insert: Any
    m_samples: Any
    m_wait: Any
    m_wal_failed: Any

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
        unlimited = self.held_unlimited[table.name]  # change nothing the limiter counts: served last
        while unlimited and table.can_sample_unlimited():
            self._serve(table, unlimited.popleft())

    def _store(self, table: Table, h: HeldInsert) -> None:
        self.held_keys.discard((h.peer.sender, h.peer.seq))
        self.held_bytes -= h.nbytes
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
        s = table.sample(h.batch_size, h.beta, counted=h.rate_limited)
        self.m_samples.labels(table.name).inc(len(s.keys))
        self.m_wait.labels("sample").inc(time.monotonic() - h.since)
        arrays = {"key": s.keys, "probability": s.probability, "weight": s.weight, **s.data}
        body = {"table": table.name, "shard": self.shard, "table_size": size}
        batch = Message("batch", body, arrays)
        if popped:  # sent with the burst's acks, after the fsync of its pop
            self._defer(h.peer, batch)
        else:
            self.reply(h.peer, batch)

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
