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

What is stored or served when the limiter lets it go is acked (or sent) with
the burst's other replies: :mod:`rlfleet.services.replay.burst_replies`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass

import numpy as np

from rlfleet.common.wire.errors import RequestError
from rlfleet.common.wire.server import Peer
from rlfleet.services.replay.columnar import Table
from rlfleet.services.replay.insert_writer import InsertWriter
from rlfleet.services.replay.metrics import ReplayMetrics
from rlfleet.services.replay.replier import Replier
from rlfleet.services.replay.sample_responder import SampleResponder

MAX_HELD_INSERTS = 10_000  # per table; beyond, inserts are dropped unacked and the client resends
MAX_HELD_BYTES = 256 << 20  # all tables: the arrays held inserts keep alive; beyond, dropped the same way
MAX_HELD_SAMPLES = 1_000  # per table; beyond, samples are refused with reason 'busy'


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
    deadline: float
    since: float
    rate_limited: bool = True  # False: waits for min_size only, not counted by the limiter


@dataclass
class HeldRequests:
    """Owns the requests the tables' rate limiters hold: per table a FIFO of inserts, of samples,
    and of samples sent with ``rate_limited: false``; the (sender, seq) and bytes of the held inserts.
    Stores and answers them (through ``writer`` and ``responder``) when the limiter lets them go."""

    tables: Iterable[str]
    writer: InsertWriter
    responder: SampleResponder
    loop: Replier
    metrics: ReplayMetrics
    _: KW_ONLY
    max_inserts: int = MAX_HELD_INSERTS
    max_samples: int = MAX_HELD_SAMPLES
    max_bytes: int = MAX_HELD_BYTES

    def __post_init__(self) -> None:
        names = list(self.tables)
        self.inserts: dict[str, deque[HeldInsert]] = {n: deque() for n in names}
        self.keys: set[tuple[str, int]] = set()  # (sender, seq) of every held insert: its resends are dropped
        self.bytes = 0  # of every held insert's arrays
        self.samples: dict[str, deque[HeldSample]] = {n: deque() for n in names}
        self.unlimited: dict[str, deque[HeldSample]] = {n: deque() for n in names}  # rate_limited false

    def held_inserts(self) -> int:
        return sum(map(len, self.inserts.values()))

    def held_samples(self, table: str | None = None) -> int:
        if table is not None:
            return len(self.samples[table]) + len(self.unlimited[table])
        return sum(map(len, (*self.samples.values(), *self.unlimited.values())))

    def hold_insert(self, table: Table, peer: Peer, arrays: dict[str, np.ndarray], priority: np.ndarray | None,
                    window_start: int | None, n: int, merge_acks: bool) -> None:
        """Queue a checked insert behind the table's held ones, or drop it unacked (counted in
        replay_inserts_dropped) if too many, or too many bytes, are held: its sender resends it."""
        held = self.inserts[table.name]
        nbytes = sum(a.nbytes for a in arrays.values()) + (priority.nbytes if priority is not None else 0)
        if len(held) >= self.max_inserts or self.bytes + nbytes > self.max_bytes:
            self.metrics.dropped.inc()
            return
        held.append(HeldInsert(peer, arrays, priority, window_start, n, time.monotonic(), merge_acks, nbytes))
        self.bytes += nbytes
        self.keys.add((peer.sender, peer.seq))
        self.pump(table)

    def hold_sample(self, table: Table, peer: Peer, batch_size: int, timeout_s: float, rate_limited: bool) -> None:
        """Queue a sample (answered by :meth:`pump` as soon as it may go), or refuse it ``busy``."""
        held, unlimited = self.samples[table.name], self.unlimited[table.name]
        if len(held) + len(unlimited) >= self.max_samples:
            raise RequestError("busy", f"{len(held) + len(unlimited)} samples already held on table "
                                       f"{table.name!r}; at most {self.max_samples}")
        now = time.monotonic()
        sample = HeldSample(peer, batch_size, now + timeout_s, now, rate_limited)
        (held if rate_limited else unlimited).append(sample)
        self.pump(table)

    def pump(self, table: Table) -> None:
        """Store held inserts and answer held samples while the limiter lets them go."""
        inserts, samples = self.inserts[table.name], self.samples[table.name]
        progress = True
        while progress:
            progress = False
            while inserts and table.can_insert(inserts[0].n):
                self._store(table, inserts.popleft())
                progress = True
            while samples and table.can_sample():
                self._answer(table, samples.popleft())
                progress = True
        unlimited = self.unlimited[table.name]  # change nothing the limiter counts: answered last
        while unlimited and table.can_sample_unlimited():
            self._answer(table, unlimited.popleft())

    def _store(self, table: Table, h: HeldInsert) -> None:
        self.keys.discard((h.peer.sender, h.peer.seq))
        self.bytes -= h.nbytes
        try:
            self.writer.commit(table, h.peer, h.arrays, h.priority, h.window_start, h.n, h.merge_acks)
        except RequestError as exc:  # wal_failed: its sender is told, not whoever's request pumped it
            self.loop.reply_error(h.peer, exc.reason, exc.detail, count=exc.count)
        self.metrics.wait_insert.inc(time.monotonic() - h.since)

    def _answer(self, table: Table, h: HeldSample) -> None:
        self.responder.answer(table, h.peer, h.batch_size, h.rate_limited, h.since)

    def expire(self, now: float) -> None:
        """Answer ``timeout`` to every held sample past its deadline (not a protocol error: expected)."""
        for held in (*self.samples.values(), *self.unlimited.values()):
            if held and any(h.deadline <= now for h in held):
                keep: deque[HeldSample] = deque()
                for h in held:
                    if h.deadline <= now:
                        self.metrics.wait_sample.inc(now - h.since)
                        self.loop.reply_error(h.peer, "timeout", "the rate limiter held this sample past its "
                                              "timeout_ms", count=False)
                    else:
                        keep.append(h)
                held.clear()
                held.extend(keep)

    def export(self) -> None:
        """Set rate_limiter_held to what is held now."""
        self.metrics.held_inserts.set(self.held_inserts())
        self.metrics.held_samples.set(self.held_samples())
