"""Surviving a restarted peer, piece by piece (the whole fleet: tests/chaos/test_chaos.py).

- A replay restarted from its write-ahead log does not hold the actors back
  until the learner has sampled everything again (the samples since the last
  snapshot are not logged).
- A sample client whose replay restarted asks again at once for the samples
  the old one held, instead of after its request timeout.
- The learner's version probe tells a restarted paramserver (no versions) from
  a live one and from one that is gone, without blocking.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from harness.paramserver_procs import ShardProcesses
from harness.replay_helpers import replay_config, serving, transitions
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.clients.version_probe import VersionProbe
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.config import ReplayConfig, TableConfig
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.errors import CommTimeout
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.replay.server import ReplayServer


def limited(spi: float | None) -> ReplayConfig:
    table = TableConfig(name="main", kind="uniform", capacity=10_000, min_size=10, samples_per_insert=spi,
                        error_buffer=20.0 if spi else None)
    return ReplayConfig(tables=[table], durability="wal", checkpoint_every_s=3600)


def test_a_replay_restored_from_its_log_admits_inserts(tmp_path: Path) -> None:
    # 1,000 items logged (in the run, the learner sampled them about once each; that is not logged)
    with serving(limited(None), directory=tmp_path) as server:
        with InsertClient(server.endpoint, "actor") as ic:
            for i in range(10):
                ic.insert("main", transitions(0, 100 * i, 100), timeout_s=10)
            ic.flush(10)
    restarted = ReplayServer(limited(1.0), ServiceMetrics("replay"), "tcp://127.0.0.1:0", directory=tmp_path)
    try:
        assert restarted.restore() == 1000
        table = restarted.tables["main"]
        # without resuming the limiter: 1,000 inserts x 1 - 0 samples >> the window: every insert held
        assert table.can_insert(1) and table.can_sample()
    finally:
        restarted.close()


def test_sample_client_asks_again_at_once_after_replay_restarts() -> None:
    bind = f"tcp://127.0.0.1:{free_tcp_port()}"
    with SampleClient([bind], "learner", "main", batch_size=4, in_flight=2, request_timeout_s=60) as sc:
        with serving(replay_config(min_size=50), bind=bind):
            with pytest.raises(CommTimeout):  # its requests are held there: the table is below min_size
                sc.sample(timeout_s=0.5)
            assert len(sc.shards[0].in_flight) == 2
        with contextlib.ExitStack() as stack:
            deadline = time.monotonic() + 10
            while True:  # the old socket releases the port in ZeroMQ's I/O thread, soon after close
                try:
                    server = stack.enter_context(serving(replay_config(min_size=1), bind=bind))
                    break
                except zmq.ZMQError:
                    assert time.monotonic() < deadline, f"{bind} still in use"
                    time.sleep(0.05)
            with InsertClient(server.endpoint, "actor") as ic:
                ic.insert("main", transitions(0, 0, 20), timeout_s=10)
                ic.flush(10)
            batch = sc.sample(timeout_s=5)  # the held requests died with the old server: 60 s otherwise
            assert len(batch.keys) == 4
            assert sc.reconnects == 1


def test_version_probe_tells_restarted_live_and_gone_shards_apart() -> None:
    weights = {"w": np.ones((10, 10), np.float32), "b": np.zeros(10, np.float32)}
    with ShardProcesses(2) as ps:
        publisher = WeightsPublisher(ps.addresses)
        probe = VersionProbe(publisher.shards, every_s=0.0, timeout_s=2.0)  # the learner's: on the same connections
        try:
            assert until_done(probe) == ("answered", [-1, -1])  # fresh (restarted) shards hold nothing
            publisher.publish(3, weights, timeout_s=10)
            assert until_done(probe) == ("answered", [3, 3])
            ps.procs[1].kill()
            ps.procs[1].wait(10)
            # step() never blocks: each call returns long before the probe's 2 s timeout (a step
            # that waited for the dead shard would take all of it), however loaded the machine
            longest, outcome, calls = 0.0, "waiting", 0
            while outcome == "waiting":
                t0 = time.monotonic()
                outcome = probe.step()[0]
                longest, calls = max(longest, time.monotonic() - t0), calls + 1
                time.sleep(0.01)
            assert outcome == "silent" and longest < 1.0, f"a step() took {longest:.2f} s"
            assert calls > 1  # it was asked while the shard was silent, not answered at once
            assert until_done(probe)[0] == "silent"
        finally:
            publisher.close()


def until_done(probe: VersionProbe) -> tuple[str, list[int]]:
    while True:
        outcome, held, _ = probe.step()
        if outcome != "waiting":
            return outcome, held
        time.sleep(0.01)
