"""LongPolls alone: which parked waits a version wakes, which time out, and what the barrier reads."""

from __future__ import annotations

import time

from harness.paramserver_fakes import peer
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.schema import DEFAULT_MODEL
from rlfleet.common.wire.server import Peer
from rlfleet.services.paramserver.long_polls import MAX_PARKED_WAITS, MAX_WAIT_MS, LongPolls


class Gauge:
    value = -1.0

    def set(self, value: float) -> None:
        self.value = value


def test_a_version_wakes_the_waits_it_satisfies_of_its_model_only() -> None:
    gauge = Gauge()
    polls = LongPolls(gauge)
    polls.park(peer("a"), 2, 60_000, False, DEFAULT_MODEL)
    polls.park(peer("b"), 3, 60_000, True, DEFAULT_MODEL)
    polls.park(peer("c"), 1, 60_000, False, "dynamics")
    assert len(polls) == 3 and gauge.value == 3
    assert polls.woken_by(DEFAULT_MODEL, 1) == []
    woken = polls.woken_by(DEFAULT_MODEL, 2)
    assert [w.peer.sender for w in woken] == ["a"]
    assert [w.peer.sender for w in polls.woken_by(DEFAULT_MODEL, 9)] == ["b"]
    assert polls.woken_by(DEFAULT_MODEL, 9) == []
    assert len(polls) == 1 and gauge.value == 1  # the other model's wait stays


def test_one_wait_per_dealer_and_end_returns_the_earlier_one() -> None:
    polls = LongPolls(Gauge())
    polls.park(peer("a", seq=1), 2, 60_000, False, DEFAULT_MODEL)
    polls.park(peer("a", seq=2), 5, 60_000, False, DEFAULT_MODEL)
    assert len(polls) == 1
    ended = polls.end(b"a")
    assert ended is not None and ended.peer.seq == 2 and ended.min_version == 5
    assert polls.end(b"a") is None and len(polls) == 0


def test_expired_waits_leave_and_timeouts_are_clamped() -> None:
    polls = LongPolls(Gauge())
    now = time.monotonic()
    polls.park(peer("soon"), 1, 0, False, DEFAULT_MODEL)
    polls.park(peer("never"), 1, 10**9, False, DEFAULT_MODEL)  # clamped to MAX_WAIT_MS
    assert [w.peer.sender for w in polls.expired(now + 0.001)] == ["soon"]
    assert polls.expired(now + MAX_WAIT_MS / 1000 - 1) == []
    assert [w.peer.sender for w in polls.expired(now + MAX_WAIT_MS / 1000 + 1)] == ["never"]


def test_the_barrier_reads_the_highest_minimum_per_sender_and_a_change_count() -> None:
    polls = LongPolls(ServiceMetrics("paramserver").gauge("paramserver_waits_parked", "parked"))
    before = polls.changes
    polls.park(peer("actor-0"), 4, 60_000, False, DEFAULT_MODEL)
    polls.park(Peer(b"second-dealer", 1, "actor-0"), 6, 60_000, False, DEFAULT_MODEL)
    polls.park(peer("actor-1"), 3, 60_000, False, "dynamics")  # another model: not a round's wait
    assert polls.waiting_for() == {"actor-0": 6}
    assert polls.changes == before + 3
    assert polls.woken_by(DEFAULT_MODEL, 0) == [] and polls.changes == before + 3  # nothing moved


def test_it_is_full_at_the_limit() -> None:
    polls = LongPolls(Gauge())
    for i in range(MAX_PARKED_WAITS):
        polls.park(peer(f"r{i}"), 1, 60_000, False, DEFAULT_MODEL)
    assert polls.full
