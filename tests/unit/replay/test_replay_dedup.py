"""The replay server is its request loop and parts it composes: one Dedup that every part which
stores or restores inserts shares, no base but the generic loop, and duplicates answered as such."""

from __future__ import annotations

from harness.replay_helpers import ask, replay_config, serving, transitions
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.dedup import Dedup
from rlfleet.common.wire.server import Server
from rlfleet.services.replay.burst_replies import BurstReplies
from rlfleet.services.replay.fast_insert import FastInsertPath
from rlfleet.services.replay.held_requests import HeldRequests
from rlfleet.services.replay.insert_writer import InsertWriter
from rlfleet.services.replay.metrics import ReplayMetrics
from rlfleet.services.replay.recovery import Recovery
from rlfleet.services.replay.sample_responder import SampleResponder
from rlfleet.services.replay.server import ReplayServer


def test_the_server_inherits_only_the_generic_loop_and_composes_its_parts() -> None:
    assert ReplayServer.__mro__ == (ReplayServer, Server, object)
    server = ReplayServer(replay_config(), ServiceMetrics("replay"), "tcp://127.0.0.1:0")
    try:
        assert isinstance(server.dedup, Dedup)
        # one Dedup: what the full path, the fast path and recovery know of a sender is the same
        assert server.writer.dedup is server.dedup
        assert server.fast_path.dedup is server.dedup
        assert server.recovery.dedup is server.dedup
        assert server.held.writer is server.writer and server.fast_path.held is server.held
    finally:
        server.close()
    parts = (BurstReplies, InsertWriter, SampleResponder, HeldRequests, FastInsertPath, Recovery, ReplayMetrics)
    for part in parts:  # each stands alone: no part is a base or a mixin of another
        assert part.__bases__ == (object,), part


def test_a_resend_of_a_stored_insert_is_acked_as_a_duplicate_and_stored_once() -> None:
    with serving(replay_config()) as server:
        insert = Message("insert", {"table": "main", "window_start": 1}, transitions(0, 0, 5))
        first = ask(server.endpoint, insert, sender="actor", seq=1)
        again = ask(server.endpoint, Message("insert", {"table": "main", "window_start": 1}, transitions(0, 0, 5)),
                    sender="actor", seq=1)
        assert (first["stored"], first["duplicate"]) == (5, False)
        assert (again["stored"], again["duplicate"]) == (0, True)
        assert server.tables["main"].size == 5 and server.duplicates == 1
        assert server.dedup.seen("actor", 1) and len(server.dedup) == 1
