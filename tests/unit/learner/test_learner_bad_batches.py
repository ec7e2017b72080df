"""Replay fixes the learner's table to the columns the algorithm's actors insert, so a client's own
columns are refused before they are acked. Where replay could not learn them (a table the learner
does not name at replay, an env replay cannot make), the first insert fixes a table's columns, and
the learner would otherwise fail on every batch it samples, and again after each restart. It
skips them, counts the items in rlfleet_learner_items_dropped_total{reason="malformed"}, logs each
kind once, and keeps its loop (and its health) alive. Real replay, paramserver and learner processes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from harness.fleet_helpers import wait_for
from harness.service_procs import ServiceProcess, learner_fleet
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.wire.errors import RemoteError
from rlfleet.common.wire.transport import free_tcp_port


def _not_dqn_columns(n: int) -> dict[str, np.ndarray]:
    """DQN's columns but "done" for "discount"."""
    rng = np.random.default_rng(0)
    return {"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(0, 2, n),
            "reward": np.ones(n, np.float32), "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
            "done": np.zeros(n, np.float32), "version": np.zeros(n, np.int64)}


def test_replay_refuses_columns_the_algorithm_does_not_emit(tmp_path: Path) -> None:
    replay = f"tcp://127.0.0.1:{free_tcp_port()}"
    proc = ServiceProcess("replay", tmp_path, [f"network.replay=[{replay}]"])
    try:
        proc.wait_healthy(60)
        with SampleClient([replay], "check", "main", 8) as sc:  # declared before any insert
            assert sc.info()["tables"]["main"]["schema"] == {
                "obs": "float32[4]", "action": "int64[]", "reward": "float32[]", "next_obs": "float32[4]",
                "discount": "float32[]", "version": "int64[]"}
        with InsertClient(replay, "not-an-actor") as client:
            try:
                client.insert("main", _not_dqn_columns(16))
                client.flush(10)
                raise AssertionError("an insert without discount was acked")
            except RemoteError as exc:
                assert exc.reason == "schema_mismatch" and "'discount' is missing" in exc.detail, exc
    finally:
        proc.stop()


def test_learner_skips_batches_it_cannot_learn_from_and_stays_up(tmp_path: Path) -> None:
    # replay cannot make the env to learn the algorithm's columns: the first insert fixes them
    with learner_fleet(tmp_path, ["env.id=NoSuchEnv-v0"]) as fleet, \
            InsertClient(fleet.replay, "not-an-actor") as client:
        learner = fleet.learner
        client.insert("main", _not_dqn_columns(256))
        client.flush(30)
        wait_for(lambda: learner.metric("rlfleet_learner_items_dropped_total", reason="malformed") >= 32 * 5, 60,
                 "the learner to skip several malformed batches")
        time.sleep(1.0)
        assert learner.alive(), learner.log()
        learner.wait_healthy(5)
        assert learner.metric("rlfleet_learner_updates_total") == 0
        warnings = [line for line in learner.log().splitlines() if "cannot learn from" in line]
        assert len(warnings) == 1, warnings  # logged once, however many batches
        assert "discount" in warnings[0] and "done" in warnings[0], warnings[0]
        assert "Traceback" not in learner.log()
        assert "take their columns from their first insert" in fleet.replay_proc.log()
