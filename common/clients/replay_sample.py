"""The learner's replay client: :class:`SampleClient` samples from every replay shard.

No thread: replies are processed inside the caller's calls (``sample``,
``poll``, ``update_priorities``), and every blocking call takes a timeout and
raises :class:`~rlfleet.common.wire.errors.CommTimeout`.

Keeps ``in_flight`` sample requests outstanding per shard so a batch is
usually waiting when the learner asks. A batch carries each item's sampling
probability (``SampleBatch.probability``) and the table's size; importance
weights are the learner's, computed from ``probability`` with its own exponent
when it learns (``Learner.weigh``): replay knows no algorithm's knobs.
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
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from rlfleet.common.config import Experiment
from rlfleet.common.security import client_curve
from rlfleet.common.wire.codec import DEFAULT_LIMITS, Limits, Message
from rlfleet.common.wire.connection import Connection, Poller
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.common.wire.transport import DEFAULT_HWM, CurveConfig

log = logging.getLogger(__name__)


@dataclass
class SampleBatch:
    shard: int
    table: str
    keys: np.ndarray
    probability: np.ndarray  # float64: each item's sampling probability when it was drawn
    data: dict[str, np.ndarray]
    table_size: int


@dataclass
class _Shard:
    index: int
    address: str
    connection: Connection
    in_flight: dict[int, float] = field(default_factory=dict)  # seq -> sent at
    ready: deque[SampleBatch] = field(default_factory=deque)
    size: int = 0
    last_reply: float = field(default_factory=time.monotonic)
    busy_until: float = 0.0  # answered 'busy': not asked again before this


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
        seed: int | None = None,
        curve: CurveConfig | None = None,
        hwm: int = DEFAULT_HWM,
        ctx: zmq.Context[Any] | None = None,
        limits: Limits = DEFAULT_LIMITS,
        rate_limited: bool = True,
    ) -> None:
        """``rate_limited=False``: a second consumer of the table (a world-model learner): its
        requests are served once the table holds ``min_size`` items and not counted by the table's
        rate limiter, so they take nothing of the main learner's samples-per-insert budget."""
        if not addresses:
            raise ValueError("SampleClient needs at least one replay address")
        self.rate_limited = bool(rate_limited)
        self.sender = sender
        self.table = table
        self.batch_size = batch_size
        self.in_flight = in_flight
        # Batches the caller will still take (None: no end); see ask_for.
        self.wanted: int | None = None
        self.request_timeout_s = request_timeout_s
        self.stall_s = stall_s
        self.busy_backoff_s = busy_backoff_s
        self.limits = limits
        self.rng = np.random.default_rng(seed)
        # handshakes watched: a new one means the shard restarted or came back (its held requests died)
        self.shards = [_Shard(i, a, Connection(a, sender, curve=curve, hwm=hwm, ctx=ctx, limits=limits,
                                               watch_handshakes=True, seq_start=2))
                       for i, a in enumerate(addresses)]
        self.poller = Poller([s.connection for s in self.shards])
        self._by_connection = {s.connection: s for s in self.shards}
        self._errors: list[RemoteError] = []
        self._infos: dict[tuple[int, int], dict[str, Any]] = {}  # (shard, seq) -> stats
        self.priorities_sent = 0
        self.priorities_acked = 0
        self.priorities_dropped = 0
        self.priority_errors = 0
        self.keys_updated = 0
        self.reissued = 0
        self.forgotten = 0  # requests and batches dropped by ask_for or a stalled shard passed over
        self.busy = 0
        self.reconnects = 0

    @classmethod
    def from_config(cls, cfg: Experiment, sender: str, batch_size: int,
                    curve: CurveConfig | None = None) -> SampleClient:
        """``batch_size``: items per request (the learner's ``data.batch_items``)."""
        return cls(cfg.network.replay, sender, cfg.learner.table, batch_size, in_flight=cfg.learner.samples_in_flight,
                   seed=cfg.seed, curve=curve if curve is not None else client_curve(cfg, "learner"))

    def _send(self, shard: _Shard, msg: Message) -> bool:
        return shard.connection.try_send(msg) is not None

    def _top_up(self) -> None:
        now = time.monotonic()
        for s in self.shards:
            for seq, sent in list(s.in_flight.items()):
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
        if not self.rate_limited:  # only then: the requests of a rate-limited client stay as they were
            body["rate_limited"] = False
        msg = Message("sample", body)
        if not self._send(shard, msg):
            return False
        shard.in_flight[msg.seq] = now
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

    def forget_sizes(self) -> None:
        """Table sizes unknown again (e.g. a round got no batch: replay may have restarted empty)."""
        for s in self.shards:
            s.size = 0

    def _outstanding(self) -> int:
        return sum(len(s.in_flight) + len(s.ready) for s in self.shards)

    def sample(self, timeout_s: float = 30.0) -> SampleBatch:
        """One batch from one shard, with each item's sampling probability.

        The shard is drawn with probability proportional to its table size
        (as last reported), and its batch awaited; a shard that has not
        answered for ``stall_s`` while another has a batch ready is passed
        over (it is down, or its rate limiter holds the learner).
        """
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
        """The ``stats`` of one shard's info_reply (its replies to samples are handled meanwhile)."""
        msg = Message("info", {})
        if not self._send(self.shards[shard], msg):
            raise CommTimeout(f"info to replay shard {shard}: send queue full")
        deadline = time.monotonic() + timeout_s
        while (shard, msg.seq) not in self._infos:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeout(f"info from replay shard {shard}: no reply within {timeout_s:.3g} s")
            self._poll(left)
        return self._infos.pop((shard, msg.seq))

    def poll(self, timeout_s: float = 0.0) -> None:
        self._poll(timeout_s)
        self._raise()

    def _reconnected(self, shard: _Shard) -> None:
        """A new handshake with a shard after the first: the requests it held died with its connection."""
        log.info("sample client: reconnected to replay shard %d; asking again for %d lost samples",
                 shard.index, len(shard.in_flight))
        self.reconnects += 1
        self.reissued += len(shard.in_flight)
        shard.in_flight.clear()  # _top_up asks again at once (late replies to them are dropped)
        shard.busy_until = 0.0

    def _poll(self, timeout_s: float) -> None:
        for conn in self.poller.wait(timeout_s):
            shard = self._by_connection[conn]
            if conn.reconnected():
                self._reconnected(shard)
            for msg in conn.replies():
                self._handle(shard, msg)

    def _handle(self, shard: _Shard, msg: Message) -> None:
        ref = msg.get("ref_seq")
        shard.last_reply = time.monotonic()
        if msg.type == "batch":
            if shard.in_flight.pop(ref, None) is None:
                return  # a reply to a request given up on: drop it
            a = msg.arrays
            data = {k: v for k, v in a.items() if k not in ("key", "probability")}
            shard.size = int(msg["table_size"])
            shard.ready.append(SampleBatch(shard.index, msg["table"], a["key"], a["probability"], data, shard.size))
        elif msg.type == "priorities_ack":
            self.priorities_acked += 1
            self.keys_updated += int(msg["updated"])
        elif msg.type == "info_reply":
            self._infos[(shard.index, ref)] = msg["stats"]
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
            s.connection.close()

    def __enter__(self) -> SampleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
