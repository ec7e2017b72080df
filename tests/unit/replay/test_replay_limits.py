"""Replay's bounds: held samples (busy, timeout cap), held inserts (dropped unacked), priorities (max)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import zmq

from harness.replay_helpers import ask, replay_config, serving, transitions
from rlfleet.common.algorithms.importance import importance_weights
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.config import TableConfig
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.errors import CommTimeout
from rlfleet.common.wire.transport import make_socket
from rlfleet.services.replay.priorities import MAX_PRIORITY
from rlfleet.services.replay.server import MAX_SAMPLE_TIMEOUT_MS
from rlfleet.services.replay.tables import PrioritizedTable


def sample_msg(**body: Any) -> Message:
    return Message("sample", {"table": "main", "batch_size": 4, **body})


def test_held_samples_are_capped_busy_and_their_timeout_is_capped() -> None:
    with serving(replay_config(min_size=100), max_held_samples=3) as server:
        sock = make_socket(zmq.DEALER, connect=server.endpoint)
        try:
            for seq, body in ((1, {}), (2, {"timeout_ms": 10**12}), (3, {"timeout_ms": 1000}), (4, {})):
                msg = sample_msg(**body)
                msg.sender, msg.seq = "learner", seq
                sock.send_multipart(encode(msg))
            assert sock.poll(10_000), "the fourth sample got no reply"
            reply = decode(sock.recv_multipart())
            assert (reply.type, reply["reason"], reply["ref_seq"]) == ("error", "busy", 4)
        finally:
            sock.close(linger=0)
        held = list(server.held.samples["main"])
        assert len(held) == 3  # the first three are held (the table is below min_size)
        waits = [h.deadline - h.since for h in held]
        # no timeout_ms, and a huge one, both wait at most 10 minutes; a short one keeps its own
        assert waits[0] == pytest.approx(MAX_SAMPLE_TIMEOUT_MS / 1000)
        assert waits[1] == pytest.approx(MAX_SAMPLE_TIMEOUT_MS / 1000)
        assert waits[2] == pytest.approx(1.0)


def test_sample_client_backs_off_a_busy_shard_and_goes_on() -> None:
    with serving(replay_config(min_size=100), max_held_samples=1) as server:
        ep = server.endpoint
        with SampleClient([ep], "learner", "main", 8, in_flight=3, busy_backoff_s=0.2) as sc:
            with pytest.raises(CommTimeout):  # not RemoteError: busy is transient
                sc.sample(timeout_s=0.5)
            assert sc.busy >= 1
            with InsertClient(ep, "actor") as ic:
                ic.insert("main", transitions(0, 0, 100))
                ic.flush(10)
            assert len(sc.sample(timeout_s=10).keys) == 8
            assert len(sc.sample(timeout_s=10).keys) == 8


def test_inserts_beyond_the_held_cap_are_dropped_unacked_and_counted() -> None:
    # spi 1, min size 10, window 20: 20 items go, the rest is held (2 at most), then dropped
    cfg = replay_config(min_size=10, samples_per_insert=1.0, error_buffer=20.0)
    with serving(cfg, max_held_inserts=2) as server:
        sock = make_socket(zmq.DEALER, connect=server.endpoint)
        try:
            for seq in range(1, 6):
                sock.send_multipart(encode(Message("insert", {"table": "main"}, transitions(0, 10 * seq, 10),
                                                   sender="actor", seq=seq)))
            for seq in (1, 2):
                assert sock.poll(10_000)
                assert decode(sock.recv_multipart())["ref_seq"] == seq
            info = ask(server.endpoint, Message("info", {}))  # served after the five inserts
            assert info["stats"]["tables"]["main"]["held_inserts"] == 2
            assert server.replay_metrics.dropped._value.get() == 1
            assert not sock.poll(200)  # held ones wait, the dropped one is never answered
        finally:
            sock.close(linger=0)


def test_priorities_above_the_maximum_are_refused() -> None:
    with serving(replay_config(kind="prioritized", capacity=100)) as server:
        ep = server.endpoint
        ok = ask(ep, Message("insert", {"table": "main"}, {**transitions(0, 0, 4), "priority": np.full(4, 1e12)}))
        assert ok.type == "ack" and ok["stored"] == 4  # MAX_PRIORITY itself is allowed
        for huge in (1e308, 1e13):
            bad = ask(ep, Message("insert", {"table": "main"}, {**transitions(0, 4, 4), "priority": np.full(4, huge)}),
                      seq=2)
            assert (bad.type, bad["reason"]) == ("error", "bad_priority"), bad.body
            upd = ask(ep, Message("priorities", {"table": "main"},
                                  {"key": np.arange(4, dtype=np.uint64), "priority": np.full(4, huge)}))
            assert (upd.type, upd["reason"]) == ("error", "bad_priority"), upd.body
        assert server.tables["main"].size == 4
        table = server.tables["main"]
        assert isinstance(table, PrioritizedTable)
        assert table.tree.total == pytest.approx(4 * MAX_PRIORITY ** table.alpha)


@pytest.mark.parametrize("alpha", [1.0, 30.0])
def test_extreme_priorities_keep_the_tree_finite_and_weights_defined(alpha: float) -> None:
    """The probabilities a sample returns stay finite and positive, and so the learner's importance
    weights from them stay finite in [0, 1] for any exponent up to 100."""
    t = PrioritizedTable(TableConfig(name="t", kind="prioritized", capacity=64, alpha=alpha, min_size=1),
                         np.random.default_rng(0))
    prio = np.concatenate([np.full(32, MAX_PRIORITY), np.full(32, 1e-300)])
    t.insert(transitions(0, 0, 64), prio)
    t.update_priorities(np.arange(8, dtype=np.uint64), np.full(8, MAX_PRIORITY))
    assert np.isfinite(t.tree.total) and t.tree.total > 0
    s = t.sample(256)
    assert np.all(np.isfinite(s.probability)) and np.all(s.probability > 0)
    for exponent in (0.4, 1.0, 100.0):
        w = importance_weights(s.probability, exponent)
        assert np.all(np.isfinite(w)) and w.max() == 1.0 and w.min() >= 0



def test_held_inserts_are_capped_in_bytes_too() -> None:
    """300 held inserts of 4.6 MiB once took replay from 73 to 1,449 MiB: the bytes held are capped
    as well as their count; beyond, an insert is dropped unacked (its sender resends it) and counted."""
    cfg = replay_config(min_size=10, samples_per_insert=1.0, error_buffer=20.0, capacity=100)
    wide = 1 << 16  # 10 items x 64k float32 columns: ~5 MiB an insert (obs and next_obs)
    with serving(cfg, max_held_bytes=12 << 20) as server:
        sock = make_socket(zmq.DEALER, connect=server.endpoint)
        try:
            for seq in range(1, 7):
                t = transitions(0, 10 * seq, 10)
                cols = {**t, "obs": np.zeros((10, wide), np.float32), "next_obs": np.zeros((10, wide), np.float32)}
                sock.send_multipart(encode(Message("insert", {"table": "main"}, cols, sender="big", seq=seq)))
            deadline = time.monotonic() + 20  # 30 MiB on its way through one socket: wait for all six
            while (server.tables["main"].size // 10 + len(server.held.inserts["main"])
                   + server.replay_metrics.dropped._value.get() < 6 and time.monotonic() < deadline):
                time.sleep(0.05)
            info = ask(server.endpoint, Message("info", {}))
            stored = server.tables["main"].size // 10  # the limiter's window: stored and acked
            assert stored >= 2
            assert info["stats"]["tables"]["main"]["held_inserts"] == 2  # ~10.5 MiB held, under 12
            assert server.replay_metrics.dropped._value.get() == 6 - stored - 2  # one more held would pass 12 MiB
            assert 10 << 20 < server.held.bytes <= 12 << 20
        finally:
            sock.close(linger=0)
