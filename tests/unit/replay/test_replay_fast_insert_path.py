"""FastInsertPath alone, fed frames as the loop gets them: it learns a connection's layout from the
inserts the full path stored (at the second alike), then stores the next ones from their frames,
and leaves everything it must not take (duplicates, other layouts, held inserts) to the full path."""

from __future__ import annotations

from typing import Any

import numpy as np
import zmq

from harness.replay_fakes import RecordingLoop
from rlfleet.common.config import TableConfig
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.dedup import Dedup
from rlfleet.common.wire.inserts import InsertEncoder
from rlfleet.common.wire.server import Peer
from rlfleet.services.replay.burst_replies import BurstReplies
from rlfleet.services.replay.fast_insert import FastInsertPath, StoredPacked
from rlfleet.services.replay.held_requests import HeldRequests
from rlfleet.services.replay.insert_writer import InsertWriter
from rlfleet.services.replay.metrics import ReplayMetrics
from rlfleet.services.replay.sample_responder import SampleResponder
from rlfleet.services.replay.tables import make_table
from rlfleet.services.replay.versions import PublishedVersions


class Wired:
    def __init__(self) -> None:
        self.table = make_table(TableConfig(name="main", kind="uniform", capacity=100, min_size=1))
        self.loop = RecordingLoop()
        metrics = ReplayMetrics(ServiceMetrics("replay"), ["main"])
        self.dedup = Dedup()
        self.replies = BurstReplies(self.loop, None, metrics.table_inserts)
        self.writer = InsertWriter(None, self.dedup, self.replies, metrics.wal_failed_insert)
        responder = SampleResponder(self.loop, None, self.replies, 0, metrics)
        self.held = HeldRequests(["main"], self.writer, responder, self.loop, metrics)
        self.path = FastInsertPath(self.loop, self.dedup, self.held, self.writer, self.replies,
                                   PublishedVersions(None, "test"), logged=False)
        self.encoder = InsertEncoder()

    def frames(self, seq: int, n: int = 4) -> list[Any]:
        cols = {"obs": np.full((n, 2), seq, np.float32), "idx": np.arange(n, dtype=np.int64) + 100 * seq}
        return [zmq.Frame(f) for f in [b"conn", *self.encoder.frames("main", cols, "w", seq, 1)]]

    def full_path(self, frames: list[Any]) -> None:
        """What ReplayServer does with a message the fast path did not take (no limiter here)."""
        msg = decode([f.bytes for f in frames[1:]])
        n = self.table.check(msg.arrays)
        peer = Peer(frames[0].bytes, msg.seq, msg.sender)
        self.writer.commit(self.table, peer, dict(msg.arrays), None, msg["window_start"], n, True)
        assert msg.layout is not None
        self.path.remember(StoredPacked(self.table, msg.layout, n, peer, msg["window_start"]))
        self.path.learn(frames)


def test_a_layout_is_learnt_at_its_second_full_insert_then_taken_from_the_frames() -> None:
    w = Wired()
    for seq in (1, 2):
        frames = w.frames(seq)
        assert not w.path.take(frames)
        w.full_path(frames)
    assert w.path.inserts == 0 and list(w.path.layouts) == [b"conn"]
    assert w.path.take(w.frames(3))
    assert w.path.inserts == 1 and w.table.size == 12 and w.dedup.seen("w", 3)
    np.testing.assert_array_equal(w.table.columns["idx"][8:12], np.arange(300, 304))
    w.replies.flush()
    ack = w.loop.sent[-1][1]
    assert [ack["ref_seq"], *[m[0] for m in ack["more"]]] == [1, 2, 3]


def test_what_the_fast_path_must_not_take_is_left_to_the_full_path() -> None:
    w = Wired()
    for seq in (1, 2):
        w.full_path(w.frames(seq))
    assert not w.path.take(w.frames(2))  # a duplicate: acked by the full path as such
    assert not w.path.take(w.frames(4, n=5))  # another layout
    assert not w.path.take([zmq.Frame(b"conn"), zmq.Frame(b"header")])  # not an insert's three frames
    w.held.inserts["main"].append(None)  # type: ignore[arg-type]  # an insert held ahead: keep the order
    assert not w.path.take(w.frames(5))
    assert w.path.inserts == 0 and w.table.size == 8


def test_a_stored_insert_that_did_not_ask_for_merged_acks_teaches_nothing() -> None:
    w = Wired()
    for seq in (1, 2, 3):
        w.path.learn(w.frames(seq))  # nothing remembered: as after an insert without merge_acks
    assert w.path.layouts == {}
