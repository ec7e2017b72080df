"""The replay clients: resend back-off and reconnection, sampling probabilities, buffer copies."""

from __future__ import annotations

import contextlib
import math
import re
import time
from pathlib import Path

import numpy as np
import zmq

from harness.replay_helpers import replay_config, serving, transitions
from rlfleet.common.algorithms.importance import importance_weights
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.inserts import InsertEncoder
from rlfleet.common.wire.transport import free_tcp_port

# spi 1, min size 10, window 20: two batches of 10 are stored, the next ones are held
HOLDING = {"min_size": 10, "samples_per_insert": 1.0, "error_buffer": 20.0}


def fill_and_hold(ic: InsertClient) -> None:
    for i in range(4):
        ic.insert("main", transitions(0, 10 * i, 10), timeout_s=10)
    deadline = time.monotonic() + 10
    while ic.acked < 2 and time.monotonic() < deadline:
        ic.poll(0.05)
    assert ic.acked == 2 and ic.unacked == 2  # two stored, two held by the rate limiter


def poll_for(ic: InsertClient, seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        ic.poll(0.02)
    return time.monotonic() - start


def test_held_inserts_are_resent_with_a_growing_interval() -> None:
    first, cap = 0.05, 1.0
    with serving(replay_config(**HOLDING)) as server:
        with InsertClient(server.endpoint, "actor", max_unacked=2, resend_after_s=first,
                          max_resend_after_s=cap) as ic:
            fill_and_hold(ic)
            before = ic.resends
            elapsed = poll_for(ic, 3.0)
            resends = ic.resends - before
            # per insert: at most log2(cap / first) + 1 resends while the interval grows, then one per cap
            bound = 2 * (math.ceil(math.log2(cap / first)) + 1 + math.ceil(elapsed / cap) + 1)
            assert 2 <= resends <= bound, (resends, bound)  # without back-off: ~2 x 3.0 / 0.05 = 120
            assert server.duplicates >= 2  # the resends reach replay (dropped there: already held)
            assert server.tables["main"].size == 20


def test_a_reconnection_resends_the_window_at_once() -> None:
    bind = f"tcp://127.0.0.1:{free_tcp_port()}"
    # a back-off of 120 s: within the test, only the reconnection resends
    with InsertClient(bind, "actor", max_unacked=2, resend_after_s=120.0, max_resend_after_s=120.0) as ic:
        with serving(replay_config(**HOLDING), bind=bind):
            fill_and_hold(ic)
        # replay restarts and has lost what it held; this one holds nothing back
        with contextlib.ExitStack() as stack:
            deadline = time.monotonic() + 10
            while True:  # the old socket releases the port in ZeroMQ's I/O thread, soon after close
                try:
                    server = stack.enter_context(serving(replay_config(), bind=bind))
                    break
                except zmq.ZMQError:
                    assert time.monotonic() < deadline, f"{bind} still in use"
                    time.sleep(0.05)
            deadline = time.monotonic() + 30
            while ic.connects < 2:
                assert time.monotonic() < deadline, "no reconnection to the restarted replay"
                resends = ic.resends
                ic.poll(0.05)
            assert ic.resends - resends == 2  # the whole window, in the poll that saw the reconnection
            ic.flush(30)  # long before the back-off would resend
            assert server.tables["main"].size == 20
            np.testing.assert_array_equal(np.sort(server.tables["main"].columns["idx"][:20]), np.arange(20, 40))


def test_a_batch_carries_the_probabilities_the_learner_weighs_it_by() -> None:
    """Replay sends each item's sampling probability and the table's size, no weights: the learner
    weighs a batch with its own exponent when it learns it (a batch asked for ahead of time included)."""
    cfg = replay_config(kind="prioritized", capacity=200, alpha=1.0)
    priority = np.linspace(0.1, 10.0, 200)
    with serving(cfg) as server:
        with InsertClient(server.endpoint, "actor") as ic:
            ic.insert("main", transitions(0, 0, 200), priority)
            ic.flush(10)
        with SampleClient([server.endpoint], "learner", "main", 32, in_flight=2) as sc:
            for _ in range(3):
                b = sc.sample(timeout_s=10)
                assert b.table_size == 200 and set(b.data) == set(transitions(0, 0, 1))  # no weight column
                np.testing.assert_allclose(b.probability, priority[b.data["idx"]] / priority.sum())
                assert not b.probability.flags.writeable  # a view of the received frame
                for exponent in (0.4, 0.7):  # whatever the learner's exponent is now
                    expected = (b.table_size * b.probability) ** -exponent
                    np.testing.assert_allclose(importance_weights(b.probability, exponent),
                                               expected / expected.max(), rtol=1e-5)


def test_the_clients_import_nothing_of_the_services() -> None:
    root = Path(__file__).resolve().parents[3] / "common"
    for path in [*root.glob("wire/*.py"), *root.glob("clients/*.py"), *root.glob("weights_shm/*.py")]:
        assert not re.search(r"^\s*(from|import) services\b", path.read_text(), re.M), path


def test_the_caller_may_reuse_its_buffers_at_once() -> None:
    with serving(replay_config()) as server:
        with InsertClient(server.endpoint, "actor") as ic:
            cols = transitions(0, 0, 16)
            ic.insert("main", cols)
            cols["idx"][:] = -1  # what was sent is unchanged
            ic.flush(10)
        np.testing.assert_array_equal(server.tables["main"].columns["idx"][:16], np.arange(16))


def test_insert_encoder_sends_what_the_general_encoder_describes() -> None:
    enc = InsertEncoder()
    batches = [
        transitions(0, 0, 16),
        transitions(0, 16, 16),  # the same layout again: the kept header
        transitions(0, 32, 7),  # another N, and columns whose sizes need padding
        {**transitions(0, 39, 7), "priority": np.linspace(0.5, 2, 7)},
        {**transitions(0, 46, 4), "obs": np.arange(32, dtype=">f4").reshape(4, 8)},  # big-endian
        {**transitions(0, 50, 4), "obs": np.ones((8, 4), np.float32).T[:, ::1]},  # not C-contiguous
    ]
    for seq, cols in enumerate(batches, start=2**63):
        frames = enc.frames("main", cols, "actor-7", seq, seq - 1)
        assert len(frames) == 2
        got = decode([bytes(f) for f in frames])
        assert (got.type, got.sender, got.seq) == ("insert", "actor-7", seq)
        assert got.body == {"table": "main", "window_start": seq - 1, "merge_acks": True}
        assert list(got.arrays) == list(cols)
        for name, arr in cols.items():
            np.testing.assert_array_equal(got.arrays[name], arr)
        general = encode(Message("insert", got.body, cols, "actor-7", seq), packed=True)
        assert bytes(frames[1]) == bytes(general[1])  # the same payload bytes
