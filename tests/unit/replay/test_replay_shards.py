"""Several shards side by side: the learner samples from all, priorities go back to the right shard."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from harness.replay_helpers import replay_config, serving, transitions
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.config import validate
from rlfleet.common.runtime import ServiceArgs
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.replay.main import build
from rlfleet.services.replay.server import ReplayServer


@contextlib.contextmanager
def two_shards(items: tuple[int, int]) -> Iterator[tuple[ReplayServer, ReplayServer]]:
    """Two prioritized replay shards serving, holding ``items`` transitions each (writer = shard)."""
    cfg = replay_config(kind="prioritized", capacity=10_000, min_size=10)
    with serving(cfg, shard=0) as s0, serving(cfg, shard=1) as s1:
        for shard, (server, n) in enumerate(zip((s0, s1), items, strict=True)):
            with InsertClient(server.endpoint, f"a{shard}") as writer:
                writer.insert("main", transitions(shard, 0, n))
                writer.flush(5)
        yield s0, s1


def test_sample_client_spreads_over_shards_and_routes_priorities_back() -> None:
    # shard 0 holds 3x the items of shard 1: it should give about 3/4 of the batches
    with two_shards((3000, 1000)) as (s0, s1):
        with SampleClient([s0.endpoint, s1.endpoint], "learner", "main", 32, in_flight=2, seed=3) as sc:
            shards = []
            for _ in range(400):
                b = sc.sample(timeout_s=10)
                assert (b.data["writer"] == b.shard).all()  # the batch came from the shard it names
                shards.append(b.shard)
                sc.update_priorities(b, np.full(len(b.keys), 2.0))
            while sc.priorities_acked < sc.priorities_sent:
                sc.poll(0.1)
            share = np.mean(np.array(shards) == 0)
            assert 0.65 < share < 0.85, share
            assert sc.keys_updated == 400 * 32 and sc.priority_errors == 0
        # each shard saw only updates for its own keys
        assert s0.tables["main"].ignored_updates == 0 and s1.tables["main"].ignored_updates == 0
        assert s0.tables["main"].max_priority == 2.0 and s1.tables["main"].max_priority == 2.0


def test_service_build_health_and_metrics() -> None:
    ports = [free_tcp_port(), free_tcp_port()]
    exp = validate({"replay": {"shards": 2, "tables": [{"name": "main", "min_size": 1, "capacity": 100}]},
                    "network": {"replay": [f"tcp://127.0.0.1:{p}" for p in ports], "bind_host": "127.0.0.1"}})
    svc = build(exp, ServiceArgs("replay", shard=1))
    try:
        assert svc.endpoint.endswith(str(ports[1]))
        h = svc.health()
        assert h["ok"] and h["tables"] == {"main": 0} and h["shard"] == 1
        text = svc.metrics.exposition().decode()
        for name in ("rlfleet_replay_size", "rlfleet_rate_limiter_wait_seconds_total", "rlfleet_replay_inserts_total"):
            assert name in text
        assert 'side="sample"' in text and 'shard="1"' in text
    finally:
        svc.close()


def test_a_dead_shard_is_passed_over() -> None:
    cfg = replay_config(capacity=1000, min_size=1)
    dead = f"tcp://127.0.0.1:{free_tcp_port()}"  # nobody serves it
    with serving(cfg, shard=1) as live:
        with InsertClient(live.endpoint, "a") as ic:
            ic.insert("main", transitions(1, 0, 100))
            ic.flush(5)
        with SampleClient([dead, live.endpoint], "learner", "main", 8, stall_s=0.2, seed=0) as sc:
            for _ in range(20):
                assert sc.sample(timeout_s=10).shard == 1


def test_ask_for_bounds_the_requests_sent_across_shards() -> None:
    """A barrier round asks for exactly its batches: none is left in flight to be served later,
    after the next round's inserts (that would make barrier runs depend on timing)."""
    with two_shards((1000, 1000)) as (s0, s1):
        with SampleClient([s0.endpoint, s1.endpoint], "learner", "main", 32, in_flight=4, seed=3) as sc:
            served, shards = 0, set()
            for round_batches in (5, 1, 3, 8):
                sc.ask_for(round_batches)
                for _ in range(round_batches):
                    shards.add(sc.sample(timeout_s=10).shard)
                assert sc.wanted == 0
                sc.poll(0.3)  # a surplus request would be answered by now
                served += round_batches
                sampled = s0.tables["main"].sampled_items + s1.tables["main"].sampled_items
                assert sampled == served * 32
                assert not any(s.in_flight or s.ready for s in sc.shards)
            assert shards == {0, 1}  # each request's shard drawn by size, not always the first
            sc.ask_for(None)  # unbounded again: requests run ahead
            sc.sample(timeout_s=10)
            sc.poll(0.3)
            assert sum(len(s.in_flight) + len(s.ready) for s in sc.shards) > 1


def test_ask_for_passes_over_a_shard_that_holds_its_requests() -> None:
    """Shard 1 is below its min size and holds what it is asked: the round's budget must not
    stay spent on it; after stall_s its requests are forgotten and shard 0 serves the round."""
    with two_shards((1000, 5)) as (s0, s1):
        with SampleClient([s0.endpoint, s1.endpoint], "learner", "main", 32, in_flight=4, seed=3,
                          stall_s=0.2, busy_backoff_s=5.0) as sc:
            sc.ask_for(12)
            for _ in range(12):
                assert sc.sample(timeout_s=5).shard == 0
            assert sc.wanted == 0 and sc.forgotten > 0
            assert s0.tables["main"].sampled_items == 12 * 32 and s1.tables["main"].sampled_items == 0
            # the next round forgets what shard 1 still holds and starts with nothing outstanding
            sc.ask_for(0)
            assert not any(s.in_flight or s.ready for s in sc.shards)
