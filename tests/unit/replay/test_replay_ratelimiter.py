"""The rate limiter: Reverb's SampleToInsertRatio cases, deadlock refusal, and held requests over a socket."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.replay_helpers import ask, replay_config, serving, transitions
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.config import ActorConfig, ConfigError, validate
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.services.replay.ratelimiter import RateLimiter, RateLimiterError

# (min_size, spi, error_buffer, inserts, samples, size) -> (can_insert, can_sample)
CASES = [
    # min size only: inserts always go, samples once the table holds min_size
    ((10, None, None, 0, 0, 0), (True, False)),
    ((10, None, None, 9, 0, 9), (True, False)),
    ((10, None, None, 10, 0, 10), (True, True)),
    ((10, None, None, 10, 10**9, 10), (True, True)),
    # spi 1, min 10, width 20: diff = inserts - samples must stay in [0, 20]
    ((10, 1.0, 20.0, 5, 0, 5), (True, False)),  # below min size: inserts always go
    ((10, 1.0, 20.0, 10, 0, 10), (True, True)),
    ((10, 1.0, 20.0, 19, 0, 19), (True, True)),  # one more insert: 20 <= 20
    ((10, 1.0, 20.0, 20, 0, 20), (False, True)),  # 21 > 20: actors ahead, insert held
    ((10, 1.0, 20.0, 20, 19, 20), (True, True)),  # one more sample: 0 >= 0
    ((10, 1.0, 20.0, 20, 20, 20), (True, False)),  # -1 < 0: learner ahead, sample held
    # spi 4, min 10, width 10: diff = 4 x inserts - samples in [35, 45]
    ((10, 4.0, 10.0, 10, 0, 10), (True, True)),  # 44 <= 45; 39 >= 35
    ((10, 4.0, 10.0, 11, 0, 11), (False, True)),  # 48 > 45
    ((10, 4.0, 10.0, 12, 12, 12), (True, True)),  # 40 <= 45; 35 >= 35
    ((10, 4.0, 10.0, 12, 13, 12), (True, False)),  # 34 < 35
    # spi 0.5, min 10, width 2: diff = inserts / 2 - samples in [4, 6]
    ((10, 0.5, 2.0, 10, 0, 10), (True, True)),  # 5.5 <= 6; 4 >= 4
    ((10, 0.5, 2.0, 12, 0, 12), (False, True)),  # 6.5 > 6
    ((10, 0.5, 2.0, 12, 2, 12), (True, False)),  # 4.5 <= 6; 3 < 4
    # a queue drained below min size: samples wait, inserts go whatever the ratio
    ((10, 1.0, 20.0, 50, 45, 5), (True, False)),
]


@pytest.mark.parametrize("args, expected", CASES)
def test_cases_table_driven(args: tuple, expected: tuple[bool, bool]) -> None:
    min_size, spi, eb, inserts, samples, size = args
    rl = RateLimiter(min_size, spi, eb)
    rl.inserted(inserts)
    rl.sampled(samples)
    assert (rl.can_insert(size), rl.can_sample(size)) == expected


@pytest.mark.parametrize("spi, eb, ok", [
    (1.0, 1.9, False), (1.0, 2.0, True), (0.25, 1.5, False), (0.25, 2.0, True),
    (8.0, 15.9, False), (8.0, 16.0, True), (8.0, None, True),
])
def test_deadlock_refused_like_reverb(spi: float, eb: float | None, ok: bool) -> None:
    if ok:
        RateLimiter(100, spi, eb)
        validate({"replay": {"tables": [{"samples_per_insert": spi, "error_buffer": eb}]}})
        return
    with pytest.raises(RateLimiterError, match="deadlock"):
        RateLimiter(100, spi, eb)
    with pytest.raises(ConfigError, match="error_buffer"):
        validate({"replay": {"tables": [{"samples_per_insert": spi, "error_buffer": eb}]}})


def test_bad_settings_refused() -> None:
    with pytest.raises(RateLimiterError):
        RateLimiter(0)
    with pytest.raises(RateLimiterError):
        RateLimiter(10, 0.0, 10.0)


@settings(max_examples=300, deadline=None)
@given(
    min_size=st.integers(1, 50),
    spi=st.one_of(st.none(), st.floats(0.05, 16)),
    extra=st.floats(0, 3),
    n_insert=st.integers(1, 64),
    n_sample=st.integers(1, 64),
    steps=st.lists(st.booleans(), min_size=1, max_size=200),
)
def test_never_deadlocks_with_batches(min_size: int, spi: float | None, extra: float, n_insert: int,
                                      n_sample: int, steps: list[bool]) -> None:
    """Whatever the batch sizes, some side may always go (the window is >= 2 x max(1, spi))."""
    eb = None if spi is None else 2 * max(1.0, spi) * (1 + extra)
    rl = RateLimiter(min_size, spi, eb)
    capacity = min_size + 100
    size = 0
    for want_insert in steps:
        ci, cs = rl.can_insert(size), rl.can_sample(size)
        assert ci or cs, f"deadlock at inserts={rl.inserts} samples={rl.samples} size={size}"
        if (want_insert and ci) or not cs:
            rl.inserted(n_insert)
            size = min(capacity, size + n_insert)
        else:
            rl.sampled(n_sample)


def test_held_sample_times_out_then_is_released_by_inserts() -> None:
    with serving(replay_config(min_size=100)) as server:
        ep = server.endpoint
        with SampleClient([ep], "learner", "main", 8, in_flight=1, request_timeout_s=0.2) as sc:
            # the request is held (table empty), times out with reason 'timeout', and is asked again
            with pytest.raises(CommTimeout):
                sc.sample(timeout_s=0.6)
        # the reply is error reason 'timeout', an expected outcome: not counted as a protocol error
        assert ask(ep, Message("sample", {"table": "main", "batch_size": 8, "timeout_ms": 100}))["reason"] == "timeout"
        assert server.metrics.protocol_errors.labels("timeout")._value.get() == 0
        with SampleClient([ep], "learner2", "main", 8, in_flight=2) as sc, InsertClient(ep, "a") as ic:
            sc._top_up()  # two requests now held by the limiter
            deadline = time.monotonic() + 5
            held = server.held.samples["main"]
            while sum(h.peer.sender == "learner2" for h in list(held)) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sum(h.peer.sender == "learner2" for h in list(held)) == 2
            ic.insert("main", transitions(0, 0, 100))
            ic.flush(5)
            batch = sc.sample(timeout_s=5)
            assert batch.table_size == 100 and len(batch.keys) == 8


def test_actors_ahead_are_held_until_the_learner_samples() -> None:
    # spi 1, min size 10, window 20: after 2 batches of 10 the next inserts wait for samples
    with serving(replay_config(min_size=10, samples_per_insert=1.0, error_buffer=20.0)) as server:
        ep = server.endpoint
        with InsertClient(ep, "actor", max_unacked=2, resend_after_s=0.1) as ic:
            for i in range(4):
                ic.insert("main", transitions(0, 10 * i, 10), timeout_s=5)
            with pytest.raises(CommTimeout):
                ic.insert("main", transitions(0, 40, 10), timeout_s=0.5)  # window full: back-pressure
            assert ic.acked == 2 and ic.unacked == 2
            assert server.tables["main"].size == 20  # held inserts are not stored
            assert server.duplicates > 0  # their resends were dropped while held
            with SampleClient([ep], "learner", "main", 10, in_flight=1) as sc:
                for _ in range(2):
                    sc.sample(timeout_s=5)
                ic.flush(5)
                assert ic.acked == 4 and server.tables["main"].size == 40
                ic.insert("main", transitions(0, 40, 10), timeout_s=5)
                sc.sample(timeout_s=5)
                ic.flush(5)
            assert server.tables["main"].size == 50
            assert server.replay_metrics.wait.labels("insert")._value.get() > 0.3
            idx = np.sort(server.tables["main"].columns["idx"][:50])
            np.testing.assert_array_equal(idx, np.arange(50))  # each once, despite the resends


def test_the_default_window_stops_an_actor_ahead_after_max_unacked_held_inserts() -> None:
    # the config's window (InsertClient's default too): an actor whose acks the limiter holds runs
    # ahead by exactly that many inserts, none of them stored, then insert() blocks
    window = ActorConfig().max_unacked
    with serving(replay_config(capacity=100_000, min_size=10, samples_per_insert=1.0, error_buffer=20.0)) as server:
        ep = server.endpoint
        with InsertClient(ep, "actor") as ic:
            assert ic.max_unacked == window
            for i in range(2 + window):  # 2 batches of 10 are admitted, the next ones held
                ic.insert("main", transitions(0, 10 * i, 10), timeout_s=5)
            with pytest.raises(CommTimeout):
                ic.insert("main", transitions(0, 10 * (2 + window), 10), timeout_s=0.5)  # back-pressure
            assert ic.acked == 2 and ic.unacked == window
            deadline = time.monotonic() + 5
            while len(server.held.inserts["main"]) < window and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(server.held.inserts["main"]) == window
            assert server.tables["main"].size == 20  # held inserts are not stored
            with SampleClient([ep], "learner", "main", 10, in_flight=1) as sc:
                for _ in range(window):  # each batch sampled lets one held insert in
                    sc.sample(timeout_s=5)
                ic.flush(5)
                assert ic.acked == 2 + window and server.tables["main"].size == 10 * (2 + window)
                ic.insert("main", transitions(0, 10 * (2 + window), 10), timeout_s=5)
                sc.sample(timeout_s=5)
                ic.flush(5)
            n = 10 * (3 + window)
            assert server.tables["main"].size == n
            np.testing.assert_array_equal(np.sort(server.tables["main"].columns["idx"][:n]), np.arange(n))


def test_unknown_table_error_raises_in_client() -> None:
    with serving(replay_config()) as server:
        with SampleClient([server.endpoint], "learner", "nope", 4) as sc:
            with pytest.raises(RemoteError) as e:
                sc.sample(timeout_s=5)
            assert e.value.reason == "unknown_table"
        with InsertClient(server.endpoint, "a") as ic:
            ic.insert("nope", transitions(0, 0, 4))
            with pytest.raises(RemoteError, match="unknown_table"):
                ic.flush(5)
            assert np.isfinite(ic.unacked)
