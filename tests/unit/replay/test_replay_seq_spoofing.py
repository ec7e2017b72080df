"""Without CurveZMQ anyone who knows a sender id can insert as it; the seq window must not let one
such insert make replay drop the owner's inserts while acking them (issue 42, attack 5). Real sockets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.replay_helpers import ask, replay_config, serving, transitions
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.dedup import MAX_AHEAD, MAX_FIRST_AHEAD, WINDOW
from rlfleet.services.replay.server import ReplayServer


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    with serving(replay_config(capacity=100_000)) as server:
        yield server


def insert(server: ReplayServer, sender: str, seq: int) -> Message:
    """As InsertClient sends: every earlier insert acked, so window_start is the seq itself."""
    body = {"table": "main", "window_start": seq}
    return ask(server.endpoint, Message("insert", body, transitions(0, seq % 1000, 2)), sender, seq)


def test_one_insert_far_ahead_does_not_swallow_the_owners_next_inserts(replay: ReplayServer) -> None:
    for seq in range(1, 6):
        assert insert(replay, "victim", seq)["stored"] == 2
    spoof = insert(replay, "victim", 5 + MAX_AHEAD)  # within the window: taken
    assert spoof.type == "ack" and spoof["stored"] == 2
    for seq in range(6, 6 + 10):  # the owner goes on: stored, not acked as duplicates
        reply = insert(replay, "victim", seq)
        assert reply.type == "ack" and reply["stored"] == 2 and not reply["duplicate"], (seq, reply.body)
    assert replay.tables["main"].size == 2 * 16


@pytest.mark.parametrize("first", [MAX_FIRST_AHEAD, 1 << 63, (1 << 64) - 1])
def test_a_first_seq_beyond_2_32_above_the_watermark_is_refused(replay: ReplayServer, first: int) -> None:
    reply = insert(replay, "new-sender", first)
    assert reply.type == "error" and reply["reason"] == "seq_out_of_window", reply.body
    assert "first" in reply["detail"] and "first_seq" in reply["detail"]
    assert replay.tables["main"].size == 0


def test_an_owner_whose_seqs_were_claimed_is_told_not_silently_dropped(replay: ReplayServer) -> None:
    assert insert(replay, "owner", MAX_FIRST_AHEAD - 1)["stored"] == 2  # a spoof before the owner's first insert
    for seq in (1, 2):  # an owner that numbered its seqs itself, from 1
        reply = insert(replay, "owner", seq)
        assert reply.type == "error" and reply["reason"] == "seq_out_of_window", reply.body
        assert "below" in reply["detail"] and "claimed" in reply["detail"]
    # one that asks where its seqs start goes on after the spoof: its inserts are stored, none dropped
    first = replay.dedup.first_seq("owner")
    assert first == MAX_FIRST_AHEAD
    assert insert(replay, "owner", first)["stored"] == 2
    assert replay.tables["main"].size == 4


def test_a_resend_within_the_window_is_still_a_duplicate(replay: ReplayServer) -> None:
    for seq in range(10_000, 10_000 + WINDOW):  # stored in order: the floor is the newest
        replay.dedup.add("busy", seq, seq)
    floor = 10_000 + WINDOW - 1
    assert insert(replay, "busy", floor - WINDOW + 1)["duplicate"]  # the oldest a client could resend
    assert insert(replay, "busy", floor - MAX_AHEAD)["duplicate"]  # the window's edge
    reply = insert(replay, "busy", floor - MAX_AHEAD - 1)
    assert reply.type == "error" and reply["reason"] == "seq_out_of_window", reply.body
