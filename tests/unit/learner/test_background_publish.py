"""The async learner's publish thread: real shards, real sockets; newest wins, outcomes come back."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from harness.paramserver_procs import serving
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.learner.publishing import BackgroundPublisher
from rlfleet.services.paramserver.shard import ShardServer


def weights(version: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(version)
    return {"w": rng.standard_normal((64, 32), dtype=np.float32), "b": np.full(32, version, np.float32)}


def shard(address: str) -> ShardServer:
    return ShardServer(ServiceMetrics("paramserver", 0), address, 0, 1, 5.0, shm=False)


def background(address: str, timeout_s: float) -> BackgroundPublisher:
    return BackgroundPublisher(WeightsPublisher([address], "learner", shm=False), lambda _w: timeout_s)


def wait_in_flight(pub: BackgroundPublisher) -> None:
    """Until the thread has taken the submitted snapshot and is sending it (a poll, not a sleep: on a
    loaded machine the thread may take its time)."""
    deadline = time.monotonic() + 10.0
    while not (pub._sending and pub._waiting is None):
        assert time.monotonic() < deadline, "the publish thread never took the snapshot"
        time.sleep(0.005)


def read(address: str) -> tuple[int, dict[str, Any]]:
    reader = WeightsReader([address], "reader", timeout_s=5.0, shm=False)
    try:
        got = reader.get(-1)
    finally:
        reader.close()
    assert got is not None
    return got


def test_a_submitted_snapshot_is_published_and_its_ack_comes_back() -> None:
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    with serving(shard(address)):
        pub = background(address, 5.0)
        try:
            pub.submit(1, weights(1), "update")
            assert pub.wait_idle(10.0)
            [outcome] = pub.drain()
            assert (outcome.version, outcome.error, outcome.tag) == (1, None, "update")
            assert pub.drain() == []  # handed over once
            version, got = read(address)
            assert version == 1
            for name, array in weights(1).items():
                np.testing.assert_array_equal(got[name], array)
        finally:
            pub.close(5.0)


def test_submit_never_waits_and_the_newest_snapshot_replaces_one_that_waits() -> None:
    # No paramserver yet: each publish waits its 0.6 s for acks that do not come, off the caller's thread.
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    pub = background(address, 0.6)
    try:
        pub.submit(1, weights(1))
        wait_in_flight(pub)
        pub.submit(2, weights(2))
        pub.submit(3, weights(3))  # 2 never went out: 3 takes its place (a submit that waited would replace none)
        assert pub.replaced == 1 and pub.busy
        assert pub.wait_idle(10.0)
        outcomes = pub.drain()
        assert [o.version for o in outcomes] == [1, 3]
        assert all(isinstance(o.error, CommTimeout) for o in outcomes)
        assert all(o.seconds >= 0.5 for o in outcomes)
        with serving(shard(address)):  # the paramserver comes: the next snapshot is acked
            pub.submit(4, weights(4))
            assert pub.wait_idle(10.0)
            [outcome] = pub.drain()
            assert (outcome.version, outcome.error) == (4, None)
            assert read(address)[0] == 4
    finally:
        pub.close(5.0)


def test_a_refusal_comes_back_as_the_paramservers_reason() -> None:
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    with serving(shard(address)):
        newer = WeightsPublisher([address], "learner", shm=False)
        newer.publish(5, weights(5), timeout_s=5.0)
        newer.close()
        pub = background(address, 5.0)
        try:
            pub.submit(3, weights(3))
            assert pub.wait_idle(10.0)
            [outcome] = pub.drain()
            assert isinstance(outcome.error, RemoteError) and outcome.error.reason == "stale_version"
            assert read(address)[0] == 5  # nothing of 3 reached a reader
        finally:
            pub.close(5.0)


def test_close_drops_what_waits_and_lets_the_publish_in_flight_finish() -> None:
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    pub = background(address, 0.8)
    pub.submit(1, weights(1))
    wait_in_flight(pub)
    pub.submit(2, weights(2))
    start = time.monotonic()
    pub.close(5.0)
    assert time.monotonic() - start > 0.4  # waited for 1's timeout (2 was dropped: no outcome below)
    assert [o.version for o in pub.drain()] == [1]
    try:
        pub.submit(3, weights(3))
    except RuntimeError as exc:
        assert "after close" in str(exc)
    else:
        raise AssertionError("submit after close was accepted")
