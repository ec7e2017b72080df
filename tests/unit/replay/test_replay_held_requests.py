"""HeldRequests alone, over a real table and rate limiter and a loop without a socket: what the
limiter does not admit is held, not stored; it is stored (and acked) or answered when it may go;
bounds drop inserts and refuse samples; a held sample past its deadline is answered ``timeout``."""

from __future__ import annotations

import time

import numpy as np
import pytest

from harness.replay_fakes import RecordingLoop
from rlfleet.common.config import TableConfig
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.dedup import Dedup
from rlfleet.common.wire.errors import RequestError
from rlfleet.common.wire.server import Peer
from rlfleet.services.replay.burst_replies import BurstReplies
from rlfleet.services.replay.columnar import Table
from rlfleet.services.replay.held_requests import HeldRequests
from rlfleet.services.replay.insert_writer import InsertWriter
from rlfleet.services.replay.metrics import ReplayMetrics
from rlfleet.services.replay.sample_responder import SampleResponder
from rlfleet.services.replay.tables import make_table


class Parts:
    """HeldRequests with the parts it is handed, as ReplayServer wires them (no log)."""

    def __init__(self, **limits: int) -> None:
        # one sample per insert, a window of 2: the fourth item waits for a sample
        cfg = TableConfig(name="main", kind="uniform", capacity=100, min_size=2, samples_per_insert=1.0,
                          error_buffer=2.0)
        self.table: Table = make_table(cfg, np.random.default_rng(0))
        self.loop = RecordingLoop()
        self.metrics = ReplayMetrics(ServiceMetrics("replay"), ["main"])
        self.dedup = Dedup()
        self.replies = BurstReplies(self.loop, None, self.metrics.table_inserts)
        writer = InsertWriter(None, self.dedup, self.replies, self.metrics.wal_failed_insert)
        responder = SampleResponder(self.loop, None, self.replies, 0, self.metrics)
        self.held = HeldRequests(["main"], writer, responder, self.loop, self.metrics, **limits)

    def insert(self, seq: int) -> None:
        arrays = {"x": np.full((1, 3), seq, np.float32)}
        if not self.held.inserts["main"] and self.table.can_insert(1):  # as ReplayServer.on_insert
            self.held.writer.commit(self.table, Peer(b"actor", seq, "actor"), arrays, None, None, 1, True)
            self.held.pump(self.table)
        else:
            self.held.hold_insert(self.table, Peer(b"actor", seq, "actor"), arrays, None, None, 1, True)

    def sample(self, seq: int, timeout_s: float = 60.0, rate_limited: bool = True) -> None:
        self.held.hold_sample(self.table, Peer(b"learner", seq, "learner"), 1, timeout_s, rate_limited)


def test_an_insert_the_limiter_does_not_admit_is_held_then_stored_and_acked_when_a_sample_lets_it_go() -> None:
    p = Parts()
    for seq in (1, 2, 3, 4):
        p.insert(seq)
    assert p.table.size == 3 and len(p.held.inserts["main"]) == 1
    assert p.held.keys == {("actor", 4)} and p.held.bytes == 12
    assert not p.dedup.seen("actor", 4)  # held is not stored: a resend must not be acked as stored
    p.sample(1)  # answered at once, which lets the held insert go
    assert p.table.size == 4 and not p.held.inserts["main"] and not p.held.keys and p.held.bytes == 0
    assert p.dedup.seen("actor", 4)
    assert [m.type for _, m in p.loop.sent] == ["batch"]
    p.replies.flush()
    ack = p.loop.sent[-1][1]
    assert ack.type == "ack" and [ack["ref_seq"], *[m[0] for m in ack["more"]]] == [1, 2, 3, 4]
    assert p.metrics.wait_insert._value.get() > 0


def test_a_sample_is_held_until_min_size_and_an_unlimited_one_is_not_counted() -> None:
    p = Parts()
    p.sample(1)
    p.sample(2, rate_limited=False)
    assert p.held.held_samples("main") == 2 and p.loop.sent == []
    p.insert(1)
    assert p.loop.sent == []  # 1 < min_size
    p.insert(2)
    assert [(peer.seq, m.type) for peer, m in p.loop.sent] == [(1, "batch"), (2, "batch")]
    assert p.table.limiter.samples == 1  # the unlimited one left the limiter as it was


def test_beyond_its_bounds_an_insert_is_dropped_unacked_and_a_sample_refused_busy() -> None:
    p = Parts(max_inserts=1)
    for seq in (1, 2, 3, 4, 5):  # 4 is held, 5 is one too many
        p.insert(seq)
    assert len(p.held.inserts["main"]) == 1 and p.metrics.dropped._value.get() == 1
    assert p.held.keys == {("actor", 4)}  # 5 is not held: its resend is not taken as a duplicate
    p.held.max_bytes = p.held.bytes
    p.held.max_inserts = 10
    p.insert(6)
    assert p.metrics.dropped._value.get() == 2  # too many bytes held
    q = Parts(max_samples=1)
    q.sample(1)  # held: the table is below min_size
    with pytest.raises(RequestError) as busy:
        q.sample(2)
    assert busy.value.reason == "busy" and q.held.held_samples() == 1


def test_a_held_sample_past_its_deadline_is_answered_timeout() -> None:
    p = Parts()
    p.sample(1, timeout_s=0.0)
    p.sample(2, timeout_s=60.0)
    p.held.expire(time.monotonic())
    assert [(peer.seq, m.type, m.get("reason")) for peer, m in p.loop.sent] == [(1, "error", "timeout")]
    assert p.held.held_samples() == 1
    p.held.export()
    assert p.metrics.held_samples._value.get() == 1 and p.metrics.held_inserts._value.get() == 0
