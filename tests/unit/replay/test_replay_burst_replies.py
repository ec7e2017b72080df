"""BurstReplies alone: the acks of a burst go merged by sender (or one per insert), after the log's
fsync, with the items they stored counted first; held-back replies go after the acks."""

from __future__ import annotations

from typing import Any

import pytest

from harness.replay_fakes import RecordingLoop
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.server import Peer
from rlfleet.services.replay.burst_replies import ACKS_PER_MESSAGE, BurstReplies
from rlfleet.services.replay.metrics import ReplayMetrics
from rlfleet.services.replay.storage import WalError


class SyncLog:
    """What BurstReplies needs of a write-ahead log: its fsync, here recorded (or failing)."""

    def __init__(self, loop: RecordingLoop, fail: bool = False) -> None:
        self.loop, self.fail = loop, fail
        self.synced_after: list[int] = []  # messages already sent at each sync

    def sync(self) -> bool:
        self.synced_after.append(len(self.loop.sent))
        if self.fail:
            raise WalError("fsync failed")
        return True


def make(wal: Any = None) -> tuple[BurstReplies, RecordingLoop, ReplayMetrics]:
    loop = RecordingLoop()
    metrics = ReplayMetrics(ServiceMetrics("replay"), ["main"])
    return BurstReplies(loop, wal, metrics.table_inserts), loop, metrics


def test_merged_acks_go_as_one_message_per_sender_and_the_others_one_each() -> None:
    replies, loop, metrics = make()
    for seq in (1, 2, 3):
        replies.ack_stored("main", b"a", seq, "actor-a", 10, merge=True)
    replies.ack_duplicate(b"a", 2, "actor-a", merge=True)
    replies.ack_stored("main", b"b", 7, "actor-b", 4, merge=False)
    replies.ack_stored("main", b"b", 8, "actor-b", 4, merge=False)
    assert loop.sent == []  # nothing before the burst ends
    replies.flush()
    acks = [(peer.identity, msg) for peer, msg in loop.sent]
    assert [m.type for _, m in acks] == ["ack"] * 3
    (ident, merged), *singles = acks
    assert ident == b"a"
    assert [[merged["ref_seq"], merged["stored"], merged["duplicate"]], *merged["more"]] == \
        [[1, 10, False], [2, 10, False], [3, 10, False], [2, 0, True]]
    assert [(i, m["ref_seq"], m["stored"], m.get("more")) for i, m in singles] == \
        [(b"b", 7, 4, None), (b"b", 8, 4, None)]
    assert metrics.inserts.labels("main")._value.get() == 38  # duplicates store nothing
    replies.flush()
    assert len(loop.sent) == 3 and metrics.inserts.labels("main")._value.get() == 38  # each burst's once


def test_a_burst_of_many_merged_inserts_is_split_into_messages_a_header_can_hold() -> None:
    replies, loop, _ = make()
    for seq in range(1, ACKS_PER_MESSAGE + 6):
        replies.ack_stored("main", b"a", seq, "actor", 1, merge=True)
    replies.flush()
    sizes = [1 + len(msg.get("more", [])) for _, msg in loop.sent]
    assert sizes == [ACKS_PER_MESSAGE, 5]


def test_acks_and_held_back_replies_go_after_the_fsync_and_not_at_all_if_it_fails() -> None:
    loop = RecordingLoop()
    wal = SyncLog(loop)
    replies = BurstReplies(loop, wal, ReplayMetrics(ServiceMetrics("replay"), ["main"]).table_inserts)
    replies.defer(Peer(b"learner", 5, "learner"), Message("priorities_ack", {"updated": 3}))
    replies.ack_stored("main", b"a", 1, "actor", 3, merge=True)
    replies.flush()
    assert wal.synced_after == [0]
    assert [m.type for _, m in loop.sent] == ["ack", "priorities_ack"]  # held back: after the acks
    assert loop.sent[1][1]["ref_seq"] == 5

    wal.fail = True
    replies.ack_stored("main", b"a", 2, "actor", 3, merge=True)
    with pytest.raises(WalError):
        replies.flush()
    assert len(loop.sent) == 2  # nothing of what that fsync covered is acked
