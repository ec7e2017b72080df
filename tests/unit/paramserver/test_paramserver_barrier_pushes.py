"""A synchronous gradient round counts the live registered actors only (issue 42, attack 5): a real
shard 0 in a thread, real sockets. Two strangers pushing ``barrier: true`` used to complete a round in
place of the two registered workers, whose own pushes were then refused as stale."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from harness.paramserver_procs import serving
from rlfleet.common.clients.registry import RegistryClient
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.config.sections import GradientsConfig
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.tensor_shards import Layout
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.paramserver.shard import ShardServer

W = np.zeros(4, np.float32)


@pytest.fixture
def shard() -> Iterator[tuple[str, Layout]]:
    server = ShardServer(ServiceMetrics("paramserver", 0), f"tcp://127.0.0.1:{free_tcp_port()}", 0, 1, 30.0,
                         shm=False, gradients=GradientsConfig(optimizer="sgd", lr=1.0))
    with serving(server):
        pub = WeightsPublisher([server.endpoint], "w0-publish", shm=False)
        pub.publish(0, {"w": W}, timeout_s=5)
        layout = pub.layout_for({"w": W})
        pub.close()
        yield server.endpoint, layout


def send_push(conn: Connection, layout: Layout, value: float, seq: int) -> int:
    body = {"version": 0, "num_shards": 1, "layout": layout.fingerprint, "barrier": True, "window_start": seq}
    return conn.send(Message("push_gradients", body, {"w": np.full(4, value, np.float32)}), seq=seq)


def reply(conn: Connection, seq: int, timeout_s: float = 5.0) -> Message | None:
    deadline = time.monotonic() + timeout_s
    while (got := conn.reply_to(seq)) is None:
        if time.monotonic() >= deadline or not conn.wait(deadline - time.monotonic()):
            return None
    return got


def weights(address: str) -> np.ndarray:
    reader = WeightsReader([address], "reader", shm=False)
    try:
        got = reader.get(-1, timeout_s=5)
        assert got is not None
        return got[1]["w"]
    finally:
        reader.close()


@contextmanager
def registered_workers(address: str, n: int = 2) -> Iterator[tuple[list[RegistryClient], list[Connection]]]:
    """``n`` actors w0.. that said hello, and a connection pushing as each (``w<i>/token``)."""
    actors = [RegistryClient(address, f"w{i}") for i in range(n)]
    for a in actors:
        a.hello()
    workers = [Connection(address, f"w{i}/token") for i in range(n)]
    try:
        yield actors, workers
    finally:
        for c in workers:
            c.close()


def test_strangers_cannot_complete_or_weigh_in_a_round(shard: tuple[str, Layout]) -> None:
    address, layout = shard
    strangers = [Connection(address, f"x{i}/token") for i in range(2)]
    try:
        with registered_workers(address) as (_, workers):
            for i, c in enumerate(strangers):
                got = reply(c, send_push(c, layout, 100.0, 1))
                assert got is not None and got.type == "error" and got["reason"] == "not_registered", got
                assert f"'x{i}'" in got["detail"]
            first = send_push(workers[0], layout, 1.0, 1)
            assert reply(workers[0], first, 0.5) is None  # held: w1 has not pushed yet
            second = send_push(workers[1], layout, 3.0, 1)
            for c, seq in ((workers[0], first), (workers[1], second)):
                got = reply(c, seq)
                assert got is not None and got.type == "gradients_ack" and got["applied"] and got["version"] == 1, got
            np.testing.assert_array_equal(weights(address), np.full(4, -2.0, np.float32))  # the mean of 1 and 3 only
    finally:
        for c in strangers:
            c.close()


def test_a_push_of_an_actor_that_left_counts_no_more(shard: tuple[str, Layout]) -> None:
    address, layout = shard
    with registered_workers(address) as (actors, workers):
        first = send_push(workers[0], layout, 1.0, 1)
        assert reply(workers[0], first, 0.3) is None
        actors[0].goodbye()
        got = reply(workers[0], first, 3.0)  # refused at the next tick: w0 is not live any more
        assert got is not None and got.type == "error" and got["reason"] == "not_registered", got
        second = send_push(workers[1], layout, 3.0, 1)
        got = reply(workers[1], second)
        assert got is not None and got.type == "gradients_ack" and got["applied"], got
        np.testing.assert_array_equal(weights(address), np.full(4, -3.0, np.float32))


@pytest.mark.parametrize("attacker_first", [False, True])
def test_a_push_in_another_actors_name_cannot_displace_its_own(shard: tuple[str, Layout], attacker_first: bool) -> None:
    """A push sent as ``w0/x`` used to take the round slot of actor w0: the victim's held push (``w0/token``)
    was replaced, never answered, and its gradients never counted. The slot is the full sender's now."""
    address, layout = shard
    attacker = Connection(address, "w0/x")
    try:
        with registered_workers(address) as (_, workers):
            if attacker_first:
                forged = send_push(attacker, layout, 101.0, 1)
                victim = send_push(workers[0], layout, 1.0, 1)
            else:
                victim = send_push(workers[0], layout, 1.0, 1)
                forged = send_push(attacker, layout, 101.0, 1)
            assert reply(workers[0], victim, 0.3) is None  # held: w1 has not pushed yet
            other = send_push(workers[1], layout, 3.0, 1)
            for c, seq in ((workers[0], victim), (workers[1], other), (attacker, forged)):
                got = reply(c, seq)
                assert got is not None and got.type == "gradients_ack" and got["applied"] and got["version"] == 1, got
            # each live actor weighs alike: w0 the mean of its two senders' pushes (1 and 101), w1 its 3
            np.testing.assert_array_equal(weights(address), np.full(4, -(51.0 + 3.0) / 2, np.float32))
    finally:
        attacker.close()


def test_senders_in_one_actors_name_are_bounded_per_round(shard: tuple[str, Layout]) -> None:
    from rlfleet.services.paramserver.gradient_rounds import MAX_SENDERS_PER_ACTOR

    address, layout = shard
    forgers = [Connection(address, f"w0/x{i}") for i in range(MAX_SENDERS_PER_ACTOR + 1)]
    try:
        with registered_workers(address) as (_, workers):
            seqs = [send_push(c, layout, 1.0, 1) for c in forgers]
            deadline = time.monotonic() + 5  # connections race: whichever arrives last is the one refused
            answered: dict[int, Message] = {}
            while not answered and time.monotonic() < deadline:
                time.sleep(0.01)
                answered = {i: r for i, c in enumerate(forgers) if (r := c.reply_to(seqs[i])) is not None}
            assert len(answered) == 1, answered
            ((i, r),) = answered.items()
            assert r.type == "error" and r["reason"] == "busy", r
            busy = [i]
            del forgers[busy[0]], seqs[busy[0]]
            # the round holds them inside w0's one share: w1's push completes it and every held push is answered
            own = send_push(workers[1], layout, 3.0, 1)
            got = reply(workers[1], own)
            assert got is not None and got.type == "gradients_ack" and got["applied"], got
            for c, seq in zip(forgers, seqs, strict=True):
                got = reply(c, seq)
                assert got is not None and got.type == "gradients_ack", got
            np.testing.assert_array_equal(weights(address), np.full(4, -(1.0 + 3.0) / 2, np.float32))
    finally:
        for c in forgers:
            c.close()
