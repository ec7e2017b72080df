"""InsertClient coalescing: inserts made while others are in flight go merged into one message, stored
exactly once and in order; an idle replay gets every insert at once; the window still bounds the actor."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from harness.replay_helpers import replay_config, serving, transitions
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.config import ActorConfig, ReplayConfig, TableConfig, validate
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.errors import CommTimeout
from rlfleet.services.replay.server import ReplayServer


def stored(server: object, n: int) -> dict[str, np.ndarray]:
    t = server.tables["main"]  # type: ignore[attr-defined]
    assert t.size == n
    slots = np.arange(n) % t.capacity
    return {k: t.columns[k][slots] for k in ("idx", "obs", "writer")}


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_inserts_made_while_others_fly_are_merged_and_stored_once_in_order(kind: str) -> None:
    server = ReplayServer(replay_config(kind=kind, capacity=10_000), ServiceMetrics("replay"), "tcp://127.0.0.1:0")
    loop = threading.Thread(target=server.serve, daemon=True)
    try:
        # seqs numbered by the test: a client asks replay where they start, which would wait for the loop
        with InsertClient(server.endpoint, "a", max_unacked=32, coalesce=8, seq_start=1) as ic:
            seqs = []
            for i in range(400):  # back to back; replay serves from the 17th on: the first 16 find others in flight
                if i == 16:
                    loop.start()
                prio = np.full(8, 1.0 + i) if kind == "prioritized" else None
                seqs.append(ic.insert("main", transitions(0, 8 * i, 8), priorities=prio))
                assert ic.unacked <= 32
            ic.flush(10)
            assert ic.unacked == 0 and ic.items_acked == 3200
            assert ic.coalesced > 0 and ic.acked == 400 - ic.coalesced  # messages, each one seq
            assert seqs == sorted(seqs) and len(set(seqs)) == ic.acked  # a merged insert shares its message's seq
            assert ic.acked_below == ic.next_seq
        server.stop()
        loop.join(10)
        got = stored(server, 3200)
        np.testing.assert_array_equal(got["idx"], np.arange(3200))
        np.testing.assert_array_equal(got["obs"], transitions(0, 0, 3200)["obs"])
        if kind == "prioritized":
            np.testing.assert_allclose(server.tables["main"].priority[:3200], np.repeat(np.arange(400) + 1.0, 8))
    finally:
        server.stop()
        if loop.is_alive():
            loop.join(10)
        server.close()


def test_an_idle_replay_gets_every_insert_at_once() -> None:
    with serving(replay_config()) as server:
        with InsertClient(server.endpoint, "a", max_unacked=32, coalesce=8) as ic:
            for i in range(20):
                ic.insert("main", transitions(0, 8 * i, 8))
                deadline = time.monotonic() + 5
                while ic.unacked and time.monotonic() < deadline:  # an actor between env steps
                    ic.poll(0.05)
                assert ic.unacked == 0 and server.tables["main"].size == 8 * (i + 1)  # sent, not kept back
            assert ic.coalesced == 0 and ic.acked == 20


def test_an_insert_for_another_table_goes_after_the_pending_one() -> None:
    tables = [TableConfig(name=name, kind="uniform", capacity=10_000, min_size=1) for name in ("main", "other")]
    with serving(ReplayConfig(tables=tables)) as server:
        with InsertClient(server.endpoint, "a", max_unacked=32, coalesce=8) as ic:
            for i in range(60):
                n = 8 if i % 7 else 5  # another batch size merges; another table does not
                ic.insert("other" if i % 11 == 10 else "main", transitions(i % 3, 1000 * i, n))
            ic.flush(10)
            assert ic.coalesced > 0
        for name, wanted in (("main", [i for i in range(60) if i % 11 != 10]), ("other", [10, 21, 32, 43, 54])):
            t = server.tables[name]
            idx = t.columns["idx"][:t.size]
            # every insert once, in insert order: idx is 1000 * i + j
            np.testing.assert_array_equal(np.unique(idx // 1000), wanted)
            assert (np.diff(idx) > 0).all()


def test_the_window_still_bounds_an_actor_the_rate_limiter_holds() -> None:
    # spi 1, min size 10, window 20: after 2 inserts of 10 the next ones wait for samples
    with serving(replay_config(min_size=10, samples_per_insert=1.0, error_buffer=20.0)) as server:
        with InsertClient(server.endpoint, "actor", max_unacked=8, coalesce=4, resend_after_s=0.1) as ic:
            sent = 0
            with pytest.raises(CommTimeout):
                while sent < 20:
                    ic.insert("main", transitions(0, 10 * sent, 10), timeout_s=0.5)
                    sent += 1
            # back-pressure: max_unacked inserts held (in flight or merged) beyond those stored. The
            # limiter admits a message on its first item, so a merged one may overshoot the window more
            stored_items = server.tables["main"].size
            assert ic.unacked == 8 and ic.items_acked == stored_items == 10 * (sent - 8)
            assert 20 <= stored_items < 10 * 8
            with SampleClient([server.endpoint], "learner", "main", 10, in_flight=1) as sc:
                deadline = time.monotonic() + 20
                while ic.items_acked < 10 * sent and time.monotonic() < deadline:
                    sc.sample(timeout_s=5)
                    ic.poll(0.01)
            ic.flush(5)
            assert ic.items_acked == 10 * sent and ic.unacked == 0
        t = server.tables["main"]
        np.testing.assert_array_equal(t.columns["idx"][:t.size], np.arange(10 * sent))


def test_coalescing_is_off_for_a_window_too_small_to_merge_in() -> None:
    with InsertClient("tcp://127.0.0.1:1", "a", max_unacked=2, coalesce=4) as small:
        assert small.coalesce == 1
    with InsertClient("tcp://127.0.0.1:1", "a", max_unacked=8, coalesce=4) as room:
        assert room.coalesce == 4
    with pytest.raises(ValueError, match="coalesce=0"):
        InsertClient("tcp://127.0.0.1:1", "a", coalesce=0)


def test_the_config_sets_it_for_actors_and_never_merges_into_a_queue_or_past_a_quarter_table() -> None:
    assert ActorConfig().coalesce_inserts == 8
    cfg = validate({"actor": {"coalesce_inserts": 3}, "replay": {"tables": [
        {"name": "main", "kind": "uniform", "capacity": 1000, "min_size": 1},
        {"name": "segments", "kind": "queue", "capacity": 64, "min_size": 1}]}})
    ic = InsertClient.from_config(cfg, 0, "a")
    try:
        assert ic.coalesce == 3 and ic.merge_max_items == {"main": 250, "segments": 0}
    finally:
        ic.close()
    tables = [TableConfig(name="main", kind="uniform", capacity=200, min_size=1),
              TableConfig(name="segments", kind="queue", capacity=10_000, min_size=1)]
    with serving(ReplayConfig(tables=tables)) as server:
        sizes: list[int] = []
        with InsertClient(server.endpoint, "a", max_unacked=32, coalesce=8, merge_max_items={"main": 50, "segments": 0},
                          on_ack=lambda seq, items: sizes.append(items)) as ic:
            for i in range(200):  # 16 items: 8 inserts would be 128, the table holds 200 (a quarter: 50)
                ic.insert("main", transitions(0, 16 * i, 16))
            ic.flush(10)
            merged_main = ic.coalesced
            assert merged_main > 0 and ic.acked == 200 - merged_main
            assert max(sizes) == 48 and sum(sizes) == 3200  # at most 3 inserts of 16 a message
            for i in range(100):
                ic.insert("segments", transitions(1, 8 * i, 8))
            ic.flush(10)
            assert ic.coalesced == merged_main  # queue inserts go one by one
        assert server.tables["segments"].size == 800


def test_columns_in_another_order_are_not_merged_by_position() -> None:
    with serving(replay_config(capacity=10_000)) as server:
        with InsertClient(server.endpoint, "a", max_unacked=32, coalesce=8) as ic:
            for i in range(100):
                cols = transitions(0, 8 * i, 8)
                if i % 2:  # obs and next_obs share dtype and shape: swapped by position, they would be wrong
                    cols = dict(reversed(list(cols.items())))
                ic.insert("main", cols)
            ic.flush(10)
        got = stored(server, 800)
        np.testing.assert_array_equal(got["obs"], transitions(0, 0, 800)["obs"])
        next_obs = server.tables["main"].columns["next_obs"][:800]
        np.testing.assert_array_equal(next_obs, transitions(0, 0, 800)["next_obs"])
