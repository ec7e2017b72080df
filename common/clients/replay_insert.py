"""The actors' replay client: :class:`InsertClient` sends inserts to one replay shard, exactly once.

No thread: replies are processed inside the caller's calls (``insert``,
``flush``, ``poll``), and every blocking call takes a timeout and raises
:class:`~rlfleet.common.wire.errors.CommTimeout`.

One shard: a window of un-acked inserts bounded by count and
bytes. ``insert()`` blocks while the window is full, which is how the replay
rate limiter's held acks push back on an actor. An insert not acked after
``resend_after_s`` is resent with the same (sender, seq); replay stores it
once. Each further resend of the same insert waits twice as long as the
previous one, up to ``max_resend_after_s`` (30 s): an insert held by the rate
limiter (the normal state when the actors are ahead) is not acked for a long
time, and the whole window must not cross the wire every ``resend_after_s``.
When the connection to replay is re-established (replay restarted and lost
what it held), every un-acked insert is resent at once and its back-off
starts over. An insert replay refused with ``wal_failed`` (it could not log it:
disk full) stays in the window; the first such insert is resent every
``resend_after_s`` without the doubling (replay answered at once, so nothing of it
is held there), the others on their back-off until it is acked, then all at once:
the actor blocks until replay can log again and goes on within ``resend_after_s``
once it can, and the window does not cross the wire every ``resend_after_s``.
A sender id belongs to one client: actors send as ``<actor id>/<128 random bits>``,
new at each start. Seqs start where replay says (``info_reply``'s ``first_seq``,
asked before the first insert; common/wire/dedup.py): above every seq of every sender
it forgot, and after the last stored seq of a sender id it remembers, so a client
restarted under its id never has its new inserts taken as the old one's resends,
whatever the clocks did. Each insert also carries
``window_start`` (its lowest un-acked seq) so replay can forget older seqs,
and ``merge_acks``: replay answers all of a burst's inserts with one ack.

Coalescing (``coalesce``, ``actor.coalesce_inserts``): inserts made while
others are in flight go merged into one message (common/clients/insert_window.py).

Refusals: one of :data:`DATA_REFUSALS` (``bad_value``: the insert's values, an
env's NaN observation or Inf reward, are outside what the table takes) is about
that insert's data alone: it is dropped (its items counted in ``items_refused``,
logged at most every :data:`REFUSAL_LOG_EVERY_S`) and the client goes on. Every
other refusal (``schema_mismatch``, ``batch_too_large``, a decoder's error, ...)
says the client or its config is wrong, which the next insert would repeat: it is
raised (RemoteError) at the next call.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import zmq

from rlfleet.common.clients.insert_window import PendingInsert, Unacked, merge_rows
from rlfleet.common.config import Experiment
from rlfleet.common.security import client_curve
from rlfleet.common.wire.codec import DEFAULT_LIMITS, Limits, Message
from rlfleet.common.wire.connection import Connection, Poller
from rlfleet.common.wire.dedup import first_seq_of
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.common.wire.frames import FRAMES, pack_frames
from rlfleet.common.wire.inserts import InsertEncoder
from rlfleet.common.wire.transport import DEFAULT_HWM, CurveConfig

log = logging.getLogger(__name__)

MAX_RESEND_AFTER_S = 30.0
#: refusals of one insert's data, not of the client: dropped and counted, not raised
DATA_REFUSALS = frozenset({"bad_value"})
REFUSAL_LOG_EVERY_S = 30.0  # a refused insert is logged at most this often (with the count since)
PEEK_EVERY_S = 0.002  # insert() looks for acks (and resends due) at most this often while the window has room


class InsertClient:
    def __init__(
        self,
        address: str,
        sender: str,
        *,
        max_unacked: int = 32,  # actor.max_unacked's default
        max_unacked_bytes: int = 64 << 20,
        resend_after_s: float = 2.0,
        max_resend_after_s: float = MAX_RESEND_AFTER_S,
        seq_start: int | None = None,
        curve: CurveConfig | None = None,
        hwm: int = DEFAULT_HWM,
        ctx: zmq.Context[Any] | None = None,
        limits: Limits = DEFAULT_LIMITS,
        on_ack: Callable[[int, int], None] | None = None,
        pack_frames: bool = True,
        coalesce: int = 1,
        merge_max_items: Mapping[str, int] | None = None,
    ) -> None:
        """``pack_frames``: image-stack columns go with each distinct frame once (common/wire/frames.py).
        ``coalesce``: inserts merged into one message while replay is busy (the module's docstring).
        ``merge_max_items``: per table, the most items one merged message may hold (0: never merged; a
        table it does not name is never merged); None: no limit."""
        if coalesce < 1:
            raise ValueError(f"coalesce={coalesce}: allowed: >= 1")
        self.address = address
        self.pack_frames = pack_frames
        self.sender = sender
        # called with (seq, items) once per insert, at its first ack: how an actor can keep a
        # record of what replay has confirmed (the chaos test checks replay against it)
        self.on_ack = on_ack
        self.max_unacked = max_unacked
        self.coalesce = coalesce if max_unacked >= 2 * coalesce else 1
        self._pending: PendingInsert | None = None
        self._merged_max_bytes = min(max_unacked_bytes, limits.max_message_bytes - limits.max_header_bytes)
        self.merge_max_items = None if merge_max_items is None else dict(merge_max_items)
        self._inserts = 0  # the caller's inserts in the window (messages may carry several)
        self.coalesced = 0  # inserts that went merged into another insert's message
        self.max_unacked_bytes = max_unacked_bytes
        self.resend_after_s = resend_after_s
        self.max_resend_after_s = max(resend_after_s, max_resend_after_s)
        self.limits = limits
        # handshakes watched: a new one after the first means replay restarted (or the network came
        # back): what it held is gone, so the window is resent at once
        self.connection = Connection(address, sender, curve=curve, hwm=hwm, ctx=ctx, limits=limits,
                                     watch_handshakes=True)
        self._poller = Poller([self.connection])
        # seqs start where replay says, asked before the first insert (seq_start: the caller's own start)
        self._seqs_known = seq_start is not None
        self._next_seq = seq_start if seq_start is not None else 0
        self.first_seq = self._next_seq
        self._window: OrderedDict[int, Unacked] = OrderedDict()
        self._encoder = InsertEncoder()
        # no insert of the window is due for a resend before this (monotonic time; may be early)
        self._check_at = math.inf
        self._peek_at = 0.0  # insert() looks for acks again from this time on (monotonic)
        self._bytes = 0
        self._errors: list[RemoteError] = []
        self.acked = 0
        self.items_acked = 0
        self.duplicates = 0
        self.resends = 0
        self.wal_refusals = 0  # inserts replay answered wal_failed (kept and resent later)
        self.inserts_refused = 0  # inserts replay refused for their data (DATA_REFUSALS): dropped
        self.items_refused = 0  # their items
        self._refusals_logged = (0, -math.inf)  # (inserts_refused, monotonic time) at the last log line
        self._refused: set[int] = set()  # seqs of the window replay answered wal_failed
        self._probe: int | None = None  # the one of them resent every resend_after_s

    @classmethod
    def from_config(cls, cfg: Experiment, shard: int, sender: str, curve: CurveConfig | None = None,
                    on_ack: Callable[[int, int], None] | None = None) -> InsertClient:
        a = cfg.actor
        # a merged insert stays well inside its table (one larger than the table is refused) and never
        # goes to a queue table, whose whole batches of segments are what the learner takes
        merge = {t.name: 0 if t.kind == "queue" else t.capacity // 4 for t in cfg.replay.tables}
        return cls(cfg.network.replay[shard], sender, max_unacked=a.max_unacked,
                   max_unacked_bytes=a.max_unacked_bytes, resend_after_s=a.resend_after_s,
                   curve=curve if curve is not None else client_curve(cfg, "actor"), on_ack=on_ack,
                   coalesce=a.coalesce_inserts, merge_max_items=merge)

    @property
    def connects(self) -> int:
        """Connections to replay that succeeded (the first one included)."""
        return self.connection.connects

    @property
    def reconnects(self) -> int:
        """Connections to replay after the first (a restarted replay, a network that came back)."""
        return self.connection.reconnects

    @property
    def unacked(self) -> int:
        """Inserts not acked yet (pending ones included)."""
        return self._inserts + (self._pending.inserts if self._pending else 0)

    @property
    def unacked_bytes(self) -> int:
        return self._bytes + (self._pending.nbytes if self._pending else 0)

    @property
    def acked_below(self) -> int:
        """Every seq from ``first_seq`` up to (not including) this one is acked."""
        if self._window:
            return next(iter(self._window))
        return self._pending.seq if self._pending else self._next_seq

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def _full(self, nbytes: int) -> bool:
        held = self.unacked_bytes
        return self.unacked >= self.max_unacked or (held > 0 and held + nbytes > self.max_unacked_bytes)

    def insert(self, table: str, columns: Mapping[str, np.ndarray], priorities: np.ndarray | None = None,
               timeout_s: float = 30.0) -> int:
        """Send a batch (N items per column) once the window has room; returns its seq.

        The columns are copied into the message (one packed payload frame),
        so the caller may reuse its buffers at once. Raises
        CommTimeout when the window stays full for ``timeout_s`` and
        RemoteError when replay refused an earlier insert (bad schema, ...).
        """
        if self._errors:
            self._raise()
        if not self._seqs_known:
            self._start_seqs(timeout_s)
        arrays = {k: np.asarray(v) for k, v in columns.items()}  # copied into the one payload frame
        items = len(next(iter(arrays.values()))) if arrays else 0
        if self.pack_frames and any(a.ndim >= 4 for a in arrays.values()):
            arrays = pack_frames(arrays)  # image stacks: each distinct frame sent once (common/wire/frames.py)
        if priorities is not None:
            arrays["priority"] = np.asarray(priorities, np.float64)
        nbytes = sum(a.nbytes for a in arrays.values())
        if self._full(nbytes):
            deadline = time.monotonic() + timeout_s
            while self._full(nbytes):
                self._wait(deadline, timeout_s, "window of {n} un-acked inserts still full")
        pending = self._pending
        if pending is not None and pending.add(table, arrays, items, nbytes):
            self.coalesced += 1
            seq = pending.seq
            if pending.inserts >= self.coalesce or pending.items >= pending.rows:
                self._send_pending()
        else:
            if pending is not None:  # another table or layout: the pending message goes first
                self._send_pending()  # (the window counted it already)
            seq = self._next_seq
            self._next_seq += 1
            rows = 0
            if self._window and FRAMES not in arrays and self.coalesce > 1:
                limit = None if self.merge_max_items is None else self.merge_max_items.get(table, 0)
                rows = merge_rows(self.coalesce, items, limit)
            if rows:
                self._poll(0)  # acks that came meanwhile may leave nothing in flight
            if rows and self._window:
                # inserts in flight: this one waits for them (or for more inserts to join it)
                self._pending = PendingInsert(table, seq, arrays, items, nbytes, rows, self._merged_max_bytes)
            else:
                self._send_new(table, seq, arrays, nbytes, items, 1)
        # acks that came meanwhile are read when the window is full (insert waits for one anyway) and
        # otherwise at most every PEEK_EVERY_S: a look per insert cost a poll and often found nothing
        now = time.monotonic()
        if now >= self._peek_at:
            self._peek_at = now + PEEK_EVERY_S
            self._poll(0)
        return seq

    def _start_seqs(self, timeout_s: float) -> None:
        """Ask replay where this sender's seqs start (``info_reply``'s ``first_seq``); CommTimeout if it
        does not answer within ``timeout_s`` (the caller tries again, as with a full window)."""
        reply = self.connection.request(Message("info", {}), timeout_s)
        self._next_seq = self.first_seq = first_seq_of(reply, f"replay at {self.address}")
        self._seqs_known = True

    def _wait(self, deadline: float, timeout_s: float, what: str) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CommTimeout(f"insert to {self.address}: {what.format(n=self.unacked)} after {timeout_s:.3g} s "
                              "(replay away or holding acks)")
        self._poll(min(left, self._next_resend_in()))
        self._raise()

    def _send_new(self, table: str, seq: int, arrays: Mapping[str, np.ndarray], nbytes: int, items: int,
                  inserts: int) -> None:
        window_start = next(iter(self._window)) if self._window else seq
        entry = Unacked(self._encoder.frames(table, arrays, self.sender, seq, window_start), nbytes, items, inserts,
                         self.resend_after_s)
        self._window[seq] = entry
        self._bytes += nbytes
        self._inserts += inserts
        self._send(entry)

    def _send_pending(self) -> None:
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._send_new(pending.table, pending.seq, pending.columns(), pending.nbytes, pending.items,
                           pending.inserts)

    def _send(self, entry: Unacked) -> None:
        entry.sent_at = time.monotonic()
        if not self.connection.send_frames(entry.frames):
            entry.sent_at = 0.0  # queue full: due for a resend at the next poll
        due = entry.sent_at + entry.interval
        if due < self._check_at:
            self._check_at = due

    def resend(self, seq: int | None = None) -> int:
        """Send again now one un-acked insert (or all of them); returns how many."""
        seqs = [seq] if seq is not None else list(self._window)
        count = 0
        for s in seqs:
            entry = self._window.get(s)
            if entry is not None:
                self._send(entry)
                self.resends += 1
                count += 1
        return count

    def _next_resend_in(self) -> float:
        if not self._window:
            return self.resend_after_s
        return max(0.0, self._check_at - time.monotonic())

    def poll(self, timeout_s: float = 0.0) -> int:
        """Process acks that arrived (waiting up to ``timeout_s`` for one); returns how many."""
        n = self._poll(timeout_s)
        self._raise()
        return n

    def _poll(self, timeout_s: float) -> int:
        handled = 0
        if self._poller.wait(timeout_s):
            if self.connection.reconnected():
                self._resend_all()
            for msg in self.connection.replies():
                handled += self._handle(msg)
        now = time.monotonic()
        if now >= self._check_at:  # some insert may be due for a resend: look at all of them
            check_at = math.inf
            for entry in self._window.values():
                if now >= entry.due:
                    self._send(entry)
                    entry.interval = min(entry.interval * 2, self.max_resend_after_s)
                    self.resends += 1
                check_at = min(check_at, entry.due)
            self._check_at = check_at
        if self._pending is not None and not self._window:  # nothing in flight: it waits for nothing more
            self._send_pending()
        return handled

    def _resend_all(self) -> None:
        """A reconnection: replay may have lost every held insert, so all are due now."""
        log.info("insert client %s: reconnected to %s; resending %d un-acked inserts",
                 self.sender, self.address, len(self._window))
        for entry in self._window.values():
            entry.interval = self.resend_after_s
            entry.sent_at = 0.0  # due now
        self._check_at = 0.0

    def _handle(self, msg: Message) -> int:
        ref = msg.get("ref_seq")
        if msg.type == "ack":
            self._acked(ref, msg.get("duplicate"))
            for item in msg.get("more") or ():  # further inserts the same ack answers
                if type(item) is list and len(item) == 3:
                    self._acked(item[0], item[2])
            return 1
        if msg.type == "error" and msg.get("reason") == "wal_failed" and isinstance(ref, int) and ref in self._window:
            # replay could not log it (its disk is full) and stored nothing: it stays in the window, so
            # the actor blocks (back-pressure) until replay can log. One refused insert (the probe) is
            # resent every resend_after_s, so the actor goes on soon after the disk has room (a doubled
            # back-off would have grown to max_resend_after_s by then); the others keep their back-off,
            # so the window does not cross the wire every resend_after_s while the disk is full; once
            # the probe is acked, they are all resent at once.
            self._refused.add(ref)
            if self._probe not in self._window:
                self._probe = ref
            if ref == self._probe:
                probe = self._window[ref]
                probe.interval = self.resend_after_s
                probe.sent_at = time.monotonic()
                self._check_at = min(self._check_at, probe.due)
            self.wal_refusals += 1
            if self.wal_refusals == 1 or self.wal_refusals % 100 == 0:
                log.warning("insert client %s: replay at %s could not log insert %d (%d so far), resending it later: "
                            "%s", self.sender, self.address, ref, self.wal_refusals, msg.get("detail"))
            return 1
        entry = self._window.pop(ref, None) if isinstance(ref, int) else None
        if msg.type == "error":
            if entry is not None and msg.get("reason") in DATA_REFUSALS:
                self._dropped(entry, msg)
            elif entry is not None or ref == -1:
                self._errors.append(RemoteError(msg["reason"], msg["detail"]))
        if entry is not None:
            self._bytes -= entry.nbytes
            self._inserts -= entry.inserts
        return 1

    def _dropped(self, entry: Unacked, msg: Message) -> None:
        """Replay refused an insert's data (an env's NaN, ...): dropped, counted, logged now and then."""
        self.inserts_refused += 1
        self.items_refused += entry.items
        logged, at = self._refusals_logged
        now = time.monotonic()
        if now - at >= REFUSAL_LOG_EVERY_S:
            log.warning("insert client %s: replay at %s refused %d insert(s) for their values since the last such "
                        "line (%d items dropped in all; the data is dropped, the client goes on): %s: %s",
                        self.sender, self.address, self.inserts_refused - logged, self.items_refused,
                        msg.get("reason"), msg.get("detail"))
            self._refusals_logged = (self.inserts_refused, now)

    def _acked(self, seq: Any, duplicate: Any) -> None:
        self.duplicates += duplicate is True  # counted even when a first ack came before
        entry = self._window.pop(seq, None) if type(seq) is int else None
        if self._refused and entry is not None:
            self._refused.discard(seq)
            if seq == self._probe:  # replay can log again: the other refused inserts go now
                self._probe = None
                for refused in self._refused:
                    waiting = self._window.get(refused)
                    if waiting is not None:
                        waiting.interval = self.resend_after_s
                        waiting.sent_at = 0.0  # due now
                        self._check_at = 0.0
                self._refused.clear()
        if entry is not None:
            self.acked += 1
            self.items_acked += entry.items
            self._bytes -= entry.nbytes
            self._inserts -= entry.inserts
            if self.on_ack is not None:
                self.on_ack(seq, entry.items)

    def _raise(self) -> None:
        if self._errors:
            raise self._errors.pop(0)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every insert is acked; CommTimeout otherwise."""
        deadline = time.monotonic() + timeout_s
        while self._window or self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeout(f"flush to {self.address}: {self.unacked} inserts still un-acked "
                                  f"after {timeout_s:.3g} s")
            self._poll(min(left, self._next_resend_in()))
            self._raise()
        self._raise()

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> InsertClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
