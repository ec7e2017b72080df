"""Dedup at its edges: each bound of the window, the first seq and the idle horizon taken exactly; where a
sender's seqs start; what a first insert makes known; its state and an old snapshot's; each refusal's
words (what mutation testing found unchecked: docs/testing.md)."""

from __future__ import annotations

import pytest

from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.dedup import IDLE_S, MAX_AHEAD, MAX_FIRST_AHEAD, WINDOW, Dedup, first_seq_of
from rlfleet.common.wire.errors import RemoteError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_first_seq_of_reads_an_info_reply_and_refuses_one_without_it() -> None:
    assert first_seq_of(Message("info_reply", {"stats": {"first_seq": 7}}), "replay-0") == 7
    assert first_seq_of(Message("info_reply", {"stats": {"first_seq": 0}}), "replay-0") == 0
    for reply in (Message("info_reply", {"stats": {"first_seq": -1}}), Message("info_reply", {"stats": {}}),
                  Message("info_reply", {"stats": {"first_seq": True}}), Message("info_reply", {"stats": 3}),
                  Message("info_reply", {}), Message("error", {"stats": {"first_seq": 7}})):
        with pytest.raises(RemoteError) as e:
            first_seq_of(reply, "replay-0")
        assert e.value.reason == "bad_reply"
        assert e.value.detail == ("replay-0 answered info with no first_seq (a server older than this client?);"
                                  " a sender's seqs start where the server says")


def test_a_known_senders_window_takes_max_ahead_either_side_of_its_floor_and_no_more() -> None:
    d = Dedup()
    d.add("a", MAX_AHEAD + 10, window_start=MAX_AHEAD + 10)  # floor MAX_AHEAD + 10
    floor = MAX_AHEAD + 10
    assert d.refusal("a", floor + MAX_AHEAD) is None and d.refusal("a", floor - MAX_AHEAD) is None
    above = d.refusal("a", floor + MAX_AHEAD + 1)
    assert above == ("seq_out_of_window", f"seq {floor + MAX_AHEAD + 1} is more than {MAX_AHEAD} above {floor}, the"
                     f" highest seq of sender 'a' below which all are stored; allowed: 10 to {floor + MAX_AHEAD}"
                     f" (a sender keeps at most {WINDOW} inserts un-acked with consecutive seqs; one far below means"
                     " another client claimed this sender id's seqs)")
    below = d.refusal("a", floor - MAX_AHEAD - 1)
    assert below is not None and below[1].startswith(f"seq 9 is more than {MAX_AHEAD} below {floor},")
    d.add("b", 5, window_start=5)  # near 0, the allowed range starts at 0
    assert "allowed: 0 to" in d.refusal("b", 5 + MAX_AHEAD + 1)[1]  # type: ignore[index]


def test_a_first_seq_may_lie_up_to_max_first_ahead_above_the_watermark() -> None:
    d = Dedup()
    assert d.refusal("new", MAX_FIRST_AHEAD - 1) is None  # the watermark starts at -1
    assert d.refusal("new", MAX_FIRST_AHEAD) == (
        "seq_out_of_window", f"seq {MAX_FIRST_AHEAD} is the first of sender 'new'; allowed: a first seq from 0 to"
        f" {MAX_FIRST_AHEAD - 1} (ask info_reply's first_seq)")


def test_a_full_dedup_takes_a_new_sender_once_the_oldest_was_silent_idle_s_exactly() -> None:
    clock = Clock()
    d = Dedup(max_senders=2, idle_s=30.0, service="paramserver", what="push", clock=clock)
    d.add("a", 1)
    clock.now += 1
    d.add("b", 1)
    assert d.refusal("c", 1) == ("too_many_senders", "paramserver remembers 2 senders and all sent within 30 s;"
                                 " try again later")
    clock.now += 28.0  # a silent for 29 s
    assert d.refusal("c", 1) is not None
    clock.now += 1.0  # 30 s
    assert d.refusal("c", 1) is None
    d.add("c", 50)
    assert set(d.senders) == {"b", "c"} and len(d) == 2 and d.watermark == 1


def test_an_insert_renews_a_senders_clock_and_its_place() -> None:
    clock = Clock()
    d = Dedup(max_senders=2, idle_s=30.0, clock=clock)
    d.add("a", 1)
    d.add("b", 1)
    clock.now += 20
    d.add("a", 2)  # a is the most recent now, and its clock starts again
    clock.now += 10
    assert d.refusal("c", 1) is None  # b has been silent 30 s
    d.add("c", 1)
    assert set(d.senders) == {"a", "c"}
    clock.now += 5
    d.add("c", 2)  # a (renewed at 20 s) is the oldest now
    clock.now += 10
    assert d.refusal("x", 5) is not None  # a silent 25 s
    clock.now += 5
    assert d.refusal("x", 5) is None


def test_the_defaults_are_the_documented_bounds() -> None:
    d = Dedup()
    assert (d.max_senders, d.window, d.idle_s, d.service, d.what) == (100_000, WINDOW, IDLE_S, "replay", "insert")
    assert (WINDOW, IDLE_S, MAX_AHEAD, MAX_FIRST_AHEAD) == (4096, 600.0, 8192, 1 << 32)


def test_forgotten_senders_are_refused_naming_the_watermark() -> None:
    clock = Clock()
    d = Dedup(max_senders=1, idle_s=10.0, what="push", clock=clock)
    d.add("a", 40)
    clock.now += 10
    d.add("b", 41)  # a forgotten: watermark 40
    assert d.watermark == 40 and d.first_seq("a") == 41
    assert d.refusal("a", 40) == (
        "sender_forgotten", "replay does not remember sender 'a' at seq 40: it may have forgotten it (after 10 s"
        " without a message), so it cannot tell a resend from a new push; allowed: seqs above 40, the highest seq"
        " of any sender it forgot (send as a new sender id from the first_seq an info request answers, as"
        " InsertClient does)")
    clock.now += 10  # b silent too: room for a
    assert d.refusal("a", 41) is None


def forgetting(clock: Clock) -> Dedup:
    """a (seq 40) forgotten for b, b for c: c was first seen when the watermark was 40."""
    d = Dedup(max_senders=1, idle_s=10.0, clock=clock)
    d.add("a", 40)
    clock.now += 10
    d.add("b", 30)
    clock.now += 10
    d.add("c", 50, window_start=45)
    assert set(d.senders) == {"c"} and d.watermark == 40
    return d


def test_a_sender_first_seen_after_a_forgetting_is_refused_at_or_below_its_birth_watermark() -> None:
    d = forgetting(Clock())
    assert d.refusal("c", 40) == (
        "sender_forgotten", "replay does not remember sender 'c' at seq 40: it may have forgotten it (after 10 s"
        " without a message), so it cannot tell a resend from a new insert; allowed: seqs above 40, the highest seq"
        " of any sender it forgot (send as a new sender id from the first_seq an info request answers, as"
        " InsertClient does)")
    assert d.refusal("c", 41) is None
    assert d.first_seq("c") == 51


def test_first_seq_of_a_new_and_a_known_sender() -> None:
    d = Dedup()
    assert d.first_seq("new") == 1  # above the watermark, and never 0
    d.add("a", 10, window_start=5)
    d.add("a", 12)
    assert d.first_seq("a") == 13  # after its highest stored seq, not after its floor
    assert d.seen("a", 10) and d.seen("a", 12) and not d.seen("a", 11) and not d.seen("a", 13)


def test_a_first_insert_without_window_start_knows_the_window_below_it() -> None:
    d = Dedup(window=100)
    d.add("a", 500)
    assert d.seen("a", 399) and not d.seen("a", 400) and d.seen("a", 500) and not d.seen("a", 501)
    d.add("b", 500, window_start=450)
    assert d.seen("b", 449) and not d.seen("b", 450)
    d.add("c", 500, window_start=900)  # a window_start above the seq counts as the seq
    assert d.seen("c", 499) and d.seen("c", 500) and not d.seen("c", 501)
    d.add("e", 500, window_start=100)  # a window wider than `window`: the sender says what it awaits
    assert d.seen("e", 99) and not d.seen("e", 100) and not d.seen("e", 399)


def test_a_gap_is_never_taken_as_stored() -> None:
    d = Dedup()
    d.add("a", 10, window_start=10)
    d.add("a", 12)  # 11 is still to come
    assert not d.seen("a", 11) and d.seen("a", 12)
    d.add("a", 11)
    assert d.state()["a"][:2] == [12, []]


def test_window_start_moves_a_known_senders_floor_no_higher_than_its_seq_and_its_top() -> None:
    d = Dedup()
    d.add("a", 10, window_start=10)
    d.add("a", 13)
    d.add("a", 11, window_start=14)  # above its own seq: counts as 11, so 12 is still to come
    assert not d.seen("a", 12) and d.state()["a"][:2] == [11, [13]]
    d.add("a", 15, window_start=15)  # all below 15 acked, says the sender: the floor goes up to 13, its top before
    assert d.seen("a", 12) and d.seen("a", 13) and not d.seen("a", 14) and d.state()["a"][:2] == [13, [15]]


def test_state_round_trips_and_an_old_snapshot_without_born_restores_minus_one() -> None:
    clock = Clock()
    d = forgetting(clock)
    d.add("c", 52)
    assert d.state() == {"c": [44, [50, 52], 40]}
    back = Dedup(clock=clock)
    back.restore(d.state(), watermark=d.watermark)
    assert back.state() == d.state() and back.watermark == 40 and back.first_seq("c") == 53
    assert back.refusal("c", 40) is not None and back.refusal("c", 41) is None
    old = Dedup()
    old.restore({"c": [44, [52, 50]]})
    assert old.state() == {"c": [44, [50, 52], -1]} and old.watermark == -1 and old.first_seq("c") == 53
    assert old.refusal("c", 44 + 5 * MAX_AHEAD) is None  # restored: not anchored until its next insert
    old.restore({"d": [7, []]})
    assert set(old.senders) == {"d"} and old.first_seq("d") == 8
