"""Replay clients: :class:`InsertClient` for actors, :class:`SampleClient` for the learner.

Neither uses a thread: replies are processed inside the caller's calls
(``insert``, ``flush``, ``poll``, ``sample``, ``update_priorities``), and
every blocking call takes a timeout and raises :class:`CommTimeout`.

InsertClient (one shard): a window of un-acked inserts bounded by count and
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
Seqs start at the wall clock in microseconds, so an actor that
restarts under the same id never reuses a seq; each insert also carries
``window_start`` (its lowest un-acked seq) so replay can forget older seqs,
and ``merge_acks``: replay answers all of a burst's inserts with one ack.

SampleClient (all shards): keeps ``in_flight`` sample requests outstanding
per shard so a batch is usually waiting when the learner asks. Requests go
ahead of time with the beta of their day; ``sample(beta)`` uses the server's
importance weights unless beta changed since, then recomputes them.
A shard that answers ``busy`` (too many samples held) is not asked again for
``busy_backoff_s``. ``sample()``
draws a shard with probability proportional to the size of its table (so
items are drawn roughly uniformly over the union of shards) and takes its
batch; a shard silent for ``stall_s`` is passed over for one that has a
batch ready. Priority updates go back to the
shard that served each batch, fire and forget; their acks are counted.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from common.config import Experiment
from common.protocol import (
    DEFAULT_LIMITS,
    InsertEncoder,
    Limits,
    Message,
    ProtocolError,
    decode,
    encode,
)
from common.security import client_curve
from common.server import RemoteError, recv_frames, send_parts
from common.transport import DEFAULT_HWM, CommTimeout, CurveConfig, make_socket
from services.replay.tables import importance_weights

log = logging.getLogger(__name__)

MAX_RESEND_AFTER_S = 30.0
PEEK_EVERY_S = 0.002  # insert() looks for acks (and resends due) at most this often while the window has room
_NOBLOCK = int(zmq.NOBLOCK)


@dataclass
class _Unacked:
    frames: list[Any]
    nbytes: int
    items: int
    interval: float  # wait before the next resend; doubles on each resend
    sent_at: float = 0.0

    @property
    def due(self) -> float:
        return self.sent_at + self.interval


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
    ) -> None:
        self.address = address
        self.sender = sender
        # called with (seq, items) once per insert, at its first ack: how an actor can keep a
        # record of what replay has confirmed (the chaos test checks replay against it)
        self.on_ack = on_ack
        self.max_unacked = max_unacked
        self.max_unacked_bytes = max_unacked_bytes
        self.resend_after_s = resend_after_s
        self.max_resend_after_s = max(resend_after_s, max_resend_after_s)
        self.limits = limits
        self.sock = make_socket(zmq.DEALER, connect=address, hwm=hwm, curve=curve, ctx=ctx)
        # connection events: a new handshake after the first means replay restarted (or the
        # network came back): what it held is gone, so the window is resent at once
        self._monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self.connects = 0
        self._next_seq = seq_start if seq_start is not None else time.time_ns() // 1000
        self.first_seq = self._next_seq
        self._window: OrderedDict[int, _Unacked] = OrderedDict()
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
        self._refused: set[int] = set()  # seqs of the window replay answered wal_failed
        self._probe: int | None = None  # the one of them resent every resend_after_s

    @classmethod
    def from_config(cls, cfg: Experiment, shard: int, sender: str, curve: CurveConfig | None = None,
                    on_ack: Callable[[int, int], None] | None = None) -> InsertClient:
        a = cfg.actor
        return cls(cfg.network.replay[shard], sender, max_unacked=a.max_unacked,
                   max_unacked_bytes=a.max_unacked_bytes, resend_after_s=a.resend_after_s,
                   curve=curve if curve is not None else client_curve(cfg, "actor"), on_ack=on_ack)

    @property
    def reconnects(self) -> int:
        """Connections to replay after the first (a restarted replay, a network that came back)."""
        return max(0, self.connects - 1)

    @property
    def unacked(self) -> int:
        return len(self._window)

    @property
    def unacked_bytes(self) -> int:
        return self._bytes

    @property
    def acked_below(self) -> int:
        """Every seq from ``first_seq`` up to (not including) this one is acked."""
        return next(iter(self._window)) if self._window else self._next_seq

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def _full(self, nbytes: int) -> bool:
        return len(self._window) >= self.max_unacked or (
            bool(self._window) and self._bytes + nbytes > self.max_unacked_bytes)

    def insert(self, table: str, columns: Mapping[str, np.ndarray], priorities: np.ndarray | None = None,
               timeout_s: float = 30.0) -> int:
        """Send a batch (N items per column) once the window has room; returns its seq.

        The columns are copied into the message (one packed payload frame),
        so the caller may reuse its buffers at once. Raises
        CommTimeout when the window stays full for ``timeout_s`` and
        RemoteError when replay refused an earlier insert (bad schema, ...).
        """
        self._raise()
        arrays = {k: np.asarray(v) for k, v in columns.items()}  # copied into the one payload frame
        if priorities is not None:
            arrays["priority"] = np.asarray(priorities, np.float64)
        nbytes = sum(a.nbytes for a in arrays.values())
        items = len(next(iter(arrays.values()))) if arrays else 0
        deadline = time.monotonic() + timeout_s
        while self._full(nbytes):
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeout(f"insert to {self.address}: window of {self.unacked} un-acked inserts still "
                                  f"full after {timeout_s:.3g} s (replay away or holding acks)")
            self._poll(min(left, self._next_resend_in()))
            self._raise()
        seq = self._next_seq
        self._next_seq += 1
        window_start = next(iter(self._window)) if self._window else seq
        entry = _Unacked(self._encoder.frames(table, arrays, self.sender, seq, window_start), nbytes, items,
                         self.resend_after_s)
        self._window[seq] = entry
        self._bytes += nbytes
        self._send(entry)
        # acks that came meanwhile are read when the window is full (insert waits for one anyway) and
        # otherwise at most every PEEK_EVERY_S: a look per insert cost a poll and often found nothing
        now = time.monotonic()
        if now >= self._peek_at:
            self._peek_at = now + PEEK_EVERY_S
            self._poll(0)
        return seq

    def _send(self, entry: _Unacked) -> None:
        entry.sent_at = time.monotonic()
        try:
            send_parts(self.sock, entry.frames, _NOBLOCK)
        except zmq.Again:
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
        events = dict(self._poller.poll(max(0, int(timeout_s * 1000))))
        if self._monitor in events:
            self._connection_events()
        if self.sock in events:
            while True:
                try:
                    frames = recv_frames(self.sock)
                except zmq.Again:
                    break
                handled += self._handle(frames)
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
        return handled

    def _connection_events(self) -> None:
        while True:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) < 1 or len(frames[0]) < 2:
                continue
            if int.from_bytes(frames[0][:2], "little") != zmq.EVENT_HANDSHAKE_SUCCEEDED:
                continue
            self.connects += 1
            if self.connects > 1:  # a reconnection: replay may have lost every held insert
                log.info("insert client %s: reconnected to %s; resending %d un-acked inserts",
                         self.sender, self.address, len(self._window))
                for entry in self._window.values():
                    entry.interval = self.resend_after_s
                    entry.sent_at = 0.0  # due now
                self._check_at = 0.0

    def _handle(self, frames: list[Any]) -> int:
        try:
            msg = decode(frames, self.limits)
        except ProtocolError as exc:
            log.warning("insert client %s: undecodable reply from %s: %s", self.sender, self.address, exc)
            return 0
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
            if entry is not None or ref == -1:
                self._errors.append(RemoteError(msg["reason"], msg["detail"]))
        if entry is not None:
            self._bytes -= entry.nbytes
        return 1

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
            if self.on_ack is not None:
                self.on_ack(seq, entry.items)

    def _raise(self) -> None:
        if self._errors:
            raise self._errors.pop(0)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every insert is acked; CommTimeout otherwise."""
        deadline = time.monotonic() + timeout_s
        while self._window:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeout(f"flush to {self.address}: {self.unacked} inserts still un-acked "
                                  f"after {timeout_s:.3g} s")
            self._poll(min(left, self._next_resend_in()))
            self._raise()
        self._raise()

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)
        self.sock.close(linger=0)

    def __enter__(self) -> InsertClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class SampleBatch:
    shard: int
    table: str
    keys: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray
    data: dict[str, np.ndarray]
    table_size: int
    beta: float | None = None  # the beta ``weights`` are for


@dataclass
class _Shard:
    index: int
    address: str
    sock: zmq.Socket[Any]
    in_flight: dict[int, tuple[float, float | None]] = field(default_factory=dict)  # seq -> (sent at, beta)
    ready: deque[SampleBatch] = field(default_factory=deque)
    size: int = 0
    last_reply: float = field(default_factory=time.monotonic)
    busy_until: float = 0.0  # answered 'busy': not asked again before this
    monitor: zmq.Socket[Any] | None = None  # handshakes: a new one means the shard restarted or came back
    connects: int = 0


class SampleClient:
    def __init__(
        self,
        addresses: Sequence[str],
        sender: str,
        table: str,
        batch_size: int,
        *,
        in_flight: int = 4,
        request_timeout_s: float = 30.0,
        stall_s: float = 1.0,
        busy_backoff_s: float = 1.0,
        beta: float | None = None,
        seed: int | None = None,
        curve: CurveConfig | None = None,
        hwm: int = DEFAULT_HWM,
        ctx: zmq.Context[Any] | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        if not addresses:
            raise ValueError("SampleClient needs at least one replay address")
        self.sender = sender
        self.table = table
        self.batch_size = batch_size
        self.in_flight = in_flight
        # Batches the caller will still take (None: no end); see ask_for.
        self.wanted: int | None = None
        self.request_timeout_s = request_timeout_s
        self.stall_s = stall_s
        self.busy_backoff_s = busy_backoff_s
        self.beta = beta
        self.limits = limits
        self.rng = np.random.default_rng(seed)
        self.shards = [_Shard(i, a, make_socket(zmq.DEALER, connect=a, hwm=hwm, curve=curve, ctx=ctx))
                       for i, a in enumerate(addresses)]
        self.poller = zmq.Poller()
        for s in self.shards:
            self.poller.register(s.sock, zmq.POLLIN)
            s.monitor = s.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            self.poller.register(s.monitor, zmq.POLLIN)
        self._by_sock = {s.sock: s for s in self.shards}
        self._by_monitor = {s.monitor: s for s in self.shards}
        self._seq = 1
        self._errors: list[RemoteError] = []
        self._infos: dict[int, dict[str, Any]] = {}
        self.priorities_sent = 0
        self.priorities_acked = 0
        self.priorities_dropped = 0
        self.priority_errors = 0
        self.keys_updated = 0
        self.reissued = 0
        self.forgotten = 0  # requests and batches dropped by ask_for or a stalled shard passed over
        self.weights_recomputed = 0
        self.busy = 0
        self.reconnects = 0

    @classmethod
    def from_config(cls, cfg: Experiment, sender: str, batch_size: int | None = None,
                    curve: CurveConfig | None = None) -> SampleClient:
        bs = batch_size if batch_size is not None else cfg.algorithm.batch_size
        return cls(cfg.network.replay, sender, cfg.learner.table, bs, in_flight=cfg.learner.samples_in_flight,
                   seed=cfg.seed, curve=curve if curve is not None else client_curve(cfg, "learner"))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, shard: _Shard, msg: Message) -> bool:
        msg.sender, msg.seq = self.sender, self._next_seq()
        try:
            shard.sock.send_multipart(encode(msg), copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def _top_up(self) -> None:
        now = time.monotonic()
        for s in self.shards:
            for seq, (sent, _) in list(s.in_flight.items()):
                if now - sent > self.request_timeout_s + 5.0:  # the server lost it (restart): ask again
                    del s.in_flight[seq]
                    self.reissued += 1
        if self.wanted is None:  # every shard keeps ``in_flight`` requests
            for s in self.shards:
                while now >= s.busy_until and len(s.in_flight) + len(s.ready) < self.in_flight:
                    if not self._request(s, now):
                        break
            return
        # exactly the batches still wanted, each asked of a shard drawn by its size
        while self._outstanding() < self.wanted:
            shard = self._choose([s for s in self.shards
                                  if now >= s.busy_until and len(s.in_flight) + len(s.ready) < self.in_flight])
            if shard is None or not self._request(shard, now):
                return

    def _request(self, shard: _Shard, now: float) -> bool:
        body: dict[str, Any] = {"table": self.table, "batch_size": self.batch_size,
                                "timeout_ms": int(self.request_timeout_s * 1000)}
        beta = None if self.beta is None else float(self.beta)
        if beta is not None:
            body["beta"] = beta
        msg = Message("sample", body)
        if not self._send(shard, msg):
            return False
        shard.in_flight[msg.seq] = (now, beta)
        return True

    def ask_for(self, batches: int | None) -> None:
        """From now on ask replay for exactly ``batches`` more batches (None: keep ``in_flight`` per shard).

        A barrier round asks for its own batches only, after its inserts: a request left in flight
        across the barrier could reach replay before or after the next round's inserts, and a
        fixed seed would no longer give the same run. Requests still in flight and batches not
        taken are forgotten (a late reply is dropped); shards are drawn by size per request.
        """
        for s in self.shards:
            self.forgotten += len(s.in_flight) + len(s.ready)
            s.in_flight.clear()
            s.ready.clear()
        self.wanted = batches

    def _pass_over_stalled(self) -> None:
        """With ``wanted``: requests a shard holds (below its min size, or down) use up the round's
        budget; after ``stall_s`` with no reply they are forgotten and the shard rests for
        ``busy_backoff_s``, so that the others are asked. Never the last shard answering."""
        now = time.monotonic()
        stalled = [s for s in self.shards if s.in_flight and now - s.last_reply > self.stall_s]
        if not stalled or len(stalled) == len(self.shards):
            return
        for s in stalled:
            self.forgotten += len(s.in_flight)
            s.in_flight.clear()
            s.busy_until = now + self.busy_backoff_s

    def _outstanding(self) -> int:
        return sum(len(s.in_flight) + len(s.ready) for s in self.shards)

    def sample(self, beta: float | None = None, timeout_s: float = 30.0) -> SampleBatch:
        """One batch from one shard, with importance weights for ``beta`` (when given).

        The request was sent ahead of time with the beta of then: the
        server's weights are used as they are when that is ``beta``, and
        recomputed only when ``beta`` changed since.

        The shard is drawn with probability proportional to its table size
        (as last reported), and its batch awaited; a shard that has not
        answered for ``stall_s`` while another has a batch ready is passed
        over (it is down, or its rate limiter holds the learner).
        """
        if beta is not None:
            self.beta = beta
        deadline = time.monotonic() + timeout_s
        self._top_up()
        self._poll(0)
        # with ``wanted`` the shard was drawn when the batch was asked for: take the first to come
        target = self._choose([s for s in self.shards if s.size > 0]) if self.wanted is None else None
        while True:
            self._raise()
            if target is not None and target.ready:
                shard = target
                break
            ready = [s for s in self.shards if s.ready]
            if ready and (target is None or time.monotonic() - target.last_reply > self.stall_s):
                chosen = self._choose(ready)
                assert chosen is not None
                shard = chosen
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeout(f"sample from {self.table!r}: no batch from any of {len(self.shards)} replay "
                                  f"shards within {timeout_s:.3g} s")
            self._poll(min(left, 0.1))
            if self.wanted is not None:
                self._pass_over_stalled()
            self._top_up()
        batch = shard.ready.popleft()
        if self.wanted is not None:
            self.wanted = max(0, self.wanted - 1)
        self._top_up()
        if beta is not None and beta != batch.beta:
            batch.weights = importance_weights(batch.probabilities, batch.table_size, beta)
            batch.beta = beta
            self.weights_recomputed += 1
        return batch

    def _choose(self, shards: list[_Shard]) -> _Shard | None:
        if len(shards) <= 1:
            return shards[0] if shards else None
        weights = np.array([max(s.size, 1) for s in shards], np.float64)
        return shards[int(self.rng.choice(len(shards), p=weights / weights.sum()))]

    def update_priorities(self, batch: SampleBatch | int, priorities: np.ndarray,
                          keys: np.ndarray | None = None) -> None:
        """Send new priorities to the shard that served ``batch`` (or shard index + keys)."""
        if isinstance(batch, SampleBatch):
            shard, keys = self.shards[batch.shard], batch.keys
        else:
            shard = self.shards[batch]
        if keys is None:
            raise ValueError("update_priorities(shard_index, priorities, keys): keys are required")
        msg = Message("priorities", {"table": self.table},
                      {"key": np.asarray(keys, np.uint64), "priority": np.asarray(priorities, np.float64)})
        if self._send(shard, msg):
            self.priorities_sent += 1
        else:
            self.priorities_dropped += 1
        self._poll(0)

    def info(self, shard: int = 0, timeout_s: float = 5.0) -> dict[str, Any]:
        """The ``stats`` of one shard's info_reply."""
        msg = Message("info", {})
        if not self._send(self.shards[shard], msg):
            raise CommTimeout(f"info to replay shard {shard}: send queue full")
        deadline = time.monotonic() + timeout_s
        while msg.seq not in self._infos:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeout(f"info from replay shard {shard}: no reply within {timeout_s:.3g} s")
            self._poll(left)
        return self._infos.pop(msg.seq)

    def poll(self, timeout_s: float = 0.0) -> None:
        self._poll(timeout_s)
        self._raise()

    def _reconnected(self, shard: _Shard) -> None:
        """A new handshake with a shard: after the first, the requests it held died with its connection."""
        assert shard.monitor is not None
        while True:
            try:
                frames = shard.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not frames or len(frames[0]) < 2 or \
                    int.from_bytes(frames[0][:2], "little") != zmq.EVENT_HANDSHAKE_SUCCEEDED:
                continue
            shard.connects += 1
            if shard.connects > 1:
                log.info("sample client: reconnected to replay shard %d; asking again for %d lost samples",
                         shard.index, len(shard.in_flight))
                self.reconnects += 1
                self.reissued += len(shard.in_flight)
                shard.in_flight.clear()  # _top_up asks again at once (late replies to them are dropped)
                shard.busy_until = 0.0

    def _poll(self, timeout_s: float) -> None:
        for sock, _ in self.poller.poll(max(0, int(timeout_s * 1000))):
            if sock in self._by_monitor:
                self._reconnected(self._by_monitor[sock])
                continue
            shard = self._by_sock[sock]
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._handle(shard, frames)

    def _handle(self, shard: _Shard, frames: list[Any]) -> None:
        try:
            msg = decode(frames, self.limits)
        except ProtocolError as exc:
            log.warning("sample client: undecodable reply from %s: %s", shard.address, exc)
            return
        ref = msg.get("ref_seq")
        shard.last_reply = time.monotonic()
        if msg.type == "batch":
            request = shard.in_flight.pop(ref, None)
            if request is None:
                return  # a reply to a request given up on: drop it
            a = msg.arrays
            data = {k: v for k, v in a.items() if k not in ("key", "probability", "weight")}
            shard.size = int(msg["table_size"])
            shard.ready.append(SampleBatch(shard.index, msg["table"], a["key"], a["probability"], a["weight"],
                                           data, shard.size, request[1]))
        elif msg.type == "priorities_ack":
            self.priorities_acked += 1
            self.keys_updated += int(msg["updated"])
        elif msg.type == "info_reply":
            self._infos[ref] = msg["stats"]
            table = msg["stats"].get("tables", {}).get(self.table) if isinstance(msg["stats"], dict) else None
            if isinstance(table, dict) and isinstance(table.get("size"), int):
                shard.size = table["size"]
        elif msg.type == "error":
            if shard.in_flight.pop(ref, None) is not None:
                if msg["reason"] in ("busy", "wal_failed"):  # too many held, or a queue's pop not logged: later
                    self.busy += 1
                    shard.busy_until = time.monotonic() + self.busy_backoff_s
                    log.warning("replay shard %d: %s: %s", shard.index, msg["reason"], msg["detail"])
                elif msg["reason"] != "timeout":  # a held sample that timed out is simply asked again
                    self._errors.append(RemoteError(msg["reason"], f"replay shard {shard.index}: {msg['detail']}"))
            else:
                self.priority_errors += 1
                log.warning("replay shard %d refused a request: %s: %s", shard.index, msg["reason"], msg["detail"])

    def _raise(self) -> None:
        if self._errors:
            raise self._errors.pop(0)

    def close(self) -> None:
        for s in self.shards:
            if s.monitor is not None:
                try:
                    s.sock.disable_monitor()
                except zmq.ZMQError:
                    pass
                s.monitor.close(linger=0)
            s.sock.close(linger=0)

    def __enter__(self) -> SampleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
