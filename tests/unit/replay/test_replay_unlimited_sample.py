"""Samples sent with ``rate_limited: false``: served once min_size is held, never counted by the limiter."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import zmq

from harness.replay_helpers import ask, replay_config, serving, transitions
from rlfleet.common.algorithms.importance import importance_weights
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.transport import free_tcp_port, make_socket
from rlfleet.services.replay.server import ReplayServer

# spi 1, min size 10, window 20: diff = inserts - samples must stay in [0, 20]
LIMITED = {"min_size": 10, "samples_per_insert": 1.0, "error_buffer": 20.0}
LIMITER_STATS = ("limiter_inserts", "limiter_samples", "limiter_diff")


def sample(table: str = "main", n: int = 10, timeout_ms: int = 200, **body: Any) -> Message:
    return Message("sample", {"table": table, "batch_size": n, "timeout_ms": timeout_ms, **body})


def limiter(server: ReplayServer) -> dict[str, Any]:
    stats = ask(server.endpoint, Message("info", {}), sender="info")["stats"]["tables"]["main"]
    return {k: stats[k] for k in LIMITER_STATS}


def fill(server: ReplayServer, n: int, start: int = 0, sender: str = "actor") -> None:
    with InsertClient(server.endpoint, sender) as ic:
        ic.insert("main", transitions(0, start, n), timeout_s=5)
        ic.flush(5)


def test_an_unlimited_sample_is_served_while_the_limiter_holds_and_changes_nothing_it_counts() -> None:
    with serving(replay_config(**LIMITED)) as server:
        ep = server.endpoint
        fill(server, 20)
        for i in range(2):  # the learner uses up its budget: 20 samples for 20 inserts
            assert ask(ep, sample(), seq=10 + i).type == "batch"
        budget_spent = limiter(server)
        assert budget_spent == {"limiter_inserts": 20, "limiter_samples": 20, "limiter_diff": 0.0}
        assert ask(ep, sample(), seq=20)["reason"] == "timeout"  # a rate-limited sample is held
        for i in range(50):  # 500 items taken by a second consumer
            reply = ask(ep, sample(rate_limited=False), sender="model", seq=100 + i)
            assert reply.type == "batch" and len(reply.arrays["key"]) == 10 and reply["table_size"] == 20
        assert limiter(server) == budget_spent  # exactly as if they had not been asked
        stats = ask(ep, Message("info", {}), sender="info")["stats"]["tables"]["main"]
        assert stats["sampled_items"] == 20 + 500 and stats["held_samples"] == 0
        # and the learner is admitted exactly as before: still held, then let in by one insert
        assert ask(ep, sample(), seq=21)["reason"] == "timeout"
        fill(server, 1, start=20, sender="actor2")
        assert ask(ep, sample(), seq=22).type == "batch"
        assert limiter(server) == {"limiter_inserts": 21, "limiter_samples": 30, "limiter_diff": -9.0}


def test_limiter_state_equals_that_of_a_run_without_the_unlimited_samples() -> None:
    def run(unlimited: bool) -> dict[str, Any]:
        with serving(replay_config(**LIMITED), seed=0) as server:
            answers = []
            for step in range(6):
                fill(server, 7, start=7 * step, sender=f"actor{step}")
                if unlimited:
                    for i in range(5):
                        ask(server.endpoint, sample(n=16, rate_limited=False), sender="model", seq=10 * step + i)
                reply = ask(server.endpoint, sample(n=12), seq=step)
                answers.append(reply.type if reply.type == "batch" else reply["reason"])
            return {"answers": answers, **limiter(server)}

    with_model = run(unlimited=True)
    assert with_model == run(unlimited=False)
    assert with_model["answers"] == ["timeout", "batch", "batch", "batch", "timeout", "batch"]


def test_an_unlimited_sample_waits_for_min_size_and_times_out_like_any_other() -> None:
    with serving(replay_config(**LIMITED)) as server:
        ep = server.endpoint
        assert ask(ep, sample(rate_limited=False, timeout_ms=100))["reason"] == "timeout"
        assert server.metrics.protocol_errors.labels("timeout")._value.get() == 0
        with SampleClient([ep], "model", "main", 8, in_flight=1, rate_limited=False) as sc:
            sc._top_up()  # one request, held: the table is empty
            deadline = time.monotonic() + 5
            while not server.held.unlimited["main"] and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(server.held.unlimited["main"]) == 1 and not server.held.samples["main"]
            assert ask(ep, Message("info", {}), sender="info")["stats"]["tables"]["main"]["held_samples"] == 1
            fill(server, 9)
            time.sleep(0.2)
            assert len(server.held.unlimited["main"]) == 1  # 9 < min_size: still held
            fill(server, 1, start=9, sender="actor2")
            batch = sc.sample(timeout_s=5)
            assert batch.table_size == 10 and len(batch.keys) == 8
        assert limiter(server) == {"limiter_inserts": 10, "limiter_samples": 0, "limiter_diff": 10.0}


def test_an_unlimited_sample_does_not_wait_behind_a_held_one() -> None:
    with serving(replay_config(**LIMITED)) as server:
        ep = server.endpoint
        fill(server, 10)
        assert ask(ep, sample(), seq=1).type == "batch"  # samples 10 for 10 inserts: the budget is spent
        learner = make_socket(zmq.DEALER, connect=ep)
        try:
            msg = sample(timeout_ms=5_000)
            msg.sender, msg.seq = "learner", 2
            learner.send_multipart(encode(msg))
            deadline = time.monotonic() + 5
            while not server.held.samples["main"] and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(server.held.samples["main"]) == 1
            assert ask(ep, sample(rate_limited=False), sender="model").type == "batch"
            assert len(server.held.samples["main"]) == 1  # the learner's is still held
        finally:
            learner.close(linger=0)


def test_probabilities_and_priorities_are_as_usual() -> None:
    cfg = replay_config(kind="prioritized", alpha=1.0, min_size=10, samples_per_insert=1.0, error_buffer=20.0)
    with serving(cfg) as server:
        ep = server.endpoint
        fill(server, 10)
        keys = np.arange(10, dtype=np.uint64)
        prio = np.where(keys == 3, 11.0, 1.0)  # item 3: probability 11 / 20, the others 1 / 20
        ack = ask(ep, Message("priorities", {"table": "main"}, {"key": keys, "priority": prio}))
        assert ack["updated"] == 10
        # beta (protocol 1's importance exponent): an unknown field now, ignored
        reply = ask(ep, sample(n=256, beta=1.0, rate_limited=False), sender="model")
        assert reply.type == "batch" and "weight" not in reply.arrays  # importance weights are the learner's
        drawn, p = reply.arrays["key"], reply.arrays["probability"]
        np.testing.assert_allclose(p, np.where(drawn == 3, 11 / 20, 1 / 20))
        assert 0.4 < np.mean(drawn == 3) < 0.7  # drawn by priority
        expected = (reply["table_size"] * p) ** -1.0
        np.testing.assert_allclose(importance_weights(p, 1.0), expected / expected.max(), rtol=1e-6)
        # and its keys take priority updates as any sample's do
        ack = ask(ep, Message("priorities", {"table": "main"}, {"key": drawn[:1], "priority": np.ones(1)}), seq=2)
        assert ack["updated"] == 1
        assert limiter(server)["limiter_samples"] == 0


def test_a_queue_table_refuses_it_and_the_server_goes_on() -> None:
    with serving(replay_config(kind="queue", min_size=1)) as server:
        ep = server.endpoint
        fill(server, 10)
        reply = ask(ep, sample(rate_limited=False))
        assert reply.type == "error" and reply["reason"] == "bad_request"
        assert "rate_limited=false" in reply["detail"] and "uniform and prioritized" in reply["detail"]
        assert ask(ep, sample(n=4), seq=2).type == "batch"


def test_the_client_sends_the_field_only_when_unlimited() -> None:
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    router = make_socket(zmq.ROUTER, bind=endpoint)  # stands in for replay: reads the requests as sent
    try:
        bodies = {}
        for rate_limited in (True, False):
            with SampleClient([endpoint], f"c{rate_limited}", "main", 4, in_flight=1, rate_limited=rate_limited) as sc:
                sc._top_up()
                assert router.poll(5_000)
                frames = router.recv_multipart()
                bodies[rate_limited] = decode(frames[1:]).body
        assert "rate_limited" not in bodies[True]
        assert bodies[False]["rate_limited"] is False
        assert {k: v for k, v in bodies[False].items() if k != "rate_limited"} == bodies[True]
    finally:
        router.close(linger=0)
