"""The learner never dies of a batch: replay accepts columns a client chose (the doc lets data
columns be named freely), and once a table's schema is fixed by such a client the learner would
otherwise fail on every batch it samples, and again after each restart. It skips them, counts the
items in rlfleet_learner_items_dropped_total{reason="malformed"}, logs each kind once, and keeps
its loop (and its health) alive. Real replay, paramserver and learner processes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from common.clients.replay_insert import InsertClient
from common.wire.transport import free_tcp_port
from tests.fleet_helpers import wait_for
from tests.service_procs import ServiceProcess


def test_learner_skips_batches_it_cannot_learn_from_and_stays_up(tmp_path: Path) -> None:
    replay, params = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    sets = [f"network.replay=[{replay}]", f"network.paramserver=[{params}]", "replay.tables.0.min_size=64",
            "replay.tables.0.samples_per_insert=null", "algorithm.batch_size=32"]
    procs = [ServiceProcess(name, tmp_path, sets) for name in ("replay", "paramserver")]
    for p in procs:
        p.wait_healthy(60)
    learner = ServiceProcess("learner", tmp_path, sets)
    procs.append(learner)
    client = InsertClient(replay, "not-an-actor")
    try:
        learner.wait_healthy(120)
        rng = np.random.default_rng(0)
        n = 256  # DQN's columns but "done" for "discount": the first insert fixes the table's schema
        client.insert("main", {"obs": rng.normal(size=(n, 4)).astype(np.float32),
                               "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
                               "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
                               "done": np.zeros(n, np.float32), "version": np.zeros(n, np.int64)})
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
    finally:
        client.close()
        for p in reversed(procs):
            p.stop()
