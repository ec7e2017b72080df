"""The learner never trains on an item whose version no actor acted with (issue 42, attack 4).

Replay refuses such inserts where it can ask the paramserver (tests/unit/replay/test_replay_versions.py);
here it cannot (it is pointed at no paramserver), so the forged items reach the learner, which must drop
them as ``invalid_version`` rather than take a version from the future for fresh data. Real replay,
paramserver and learner processes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.fleet_helpers import wait_for
from harness.service_procs import learner_fleet
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.wire.transport import free_tcp_port


def _transitions(n: int, version: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(version % 1000)
    return {"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(0, 2, n),
            "reward": np.ones(n, np.float32), "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
            "discount": np.full(n, 0.99, np.float32), "version": np.full(n, version, np.int64)}


def test_the_learner_drops_items_from_the_future(tmp_path: Path) -> None:
    nowhere = f"tcp://127.0.0.1:{free_tcp_port()}"
    with learner_fleet(tmp_path, [f"network.paramserver=[{nowhere}]"]) as fleet, \
            InsertClient(fleet.replay, "forger/1") as client:
        learner = fleet.learner
        client.insert("main", _transitions(128, 10**12))
        client.insert("main", _transitions(128, (1 << 63) - 1))
        client.flush(30)
        wait_for(lambda: learner.metric("rlfleet_learner_items_dropped_total", reason="invalid_version") >= 32 * 3,
                 60, "the learner to drop the forged items")
        assert learner.alive(), learner.log()
        assert learner.metric("rlfleet_learner_updates_total") == 0  # nothing else to learn from
        assert "Traceback" not in learner.log()
