"""The fleet's env-step count survives a restart of paramserver shard 0 (services/paramserver/step_counts.py).

What runs on env steps (the evaluator's every_steps and its evaluations' env steps, a learner's schedules
when it starts without a checkpoint, exploration) reads the registry's count: it must go on after the
shard restarts or a run resumes, counting nothing twice. Real shard servers (threads of this process,
one after the other on the same run directory) and real heartbeats over ZeroMQ.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from harness.service_threads import replay_and_paramserver
from rlfleet.common.clients.registry import RegistryClient
from rlfleet.common.config import load
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.paramserver.registry import Registry
from rlfleet.services.paramserver.step_counts import FILE, StepCountsFile

ROOT = Path(__file__).resolve().parents[3]


def beat(address: str, actor_id: str, env_steps: int) -> int:
    """One heartbeat reporting ``env_steps``; the fleet's count the welcome says."""
    client = RegistryClient(address, actor_id)
    try:
        return client.heartbeat(0, timeout_s=10, env_steps=env_steps).fleet_env_steps
    finally:
        client.close()


def test_the_fleet_count_goes_on_after_shard_0_restarts(tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    cfg = load(ROOT / "configs" / "cartpole-dqn.yaml", [f"network.paramserver=[{address}]",
               f"network.replay=[tcp://127.0.0.1:{free_tcp_port()}]", f"run_dir={tmp_path}"], environ={})
    with replay_and_paramserver(cfg):
        assert beat(address, "actor-0", 3_000) == 3_000
        assert beat(address, "actor-1", 2_000) == 5_000
    assert json.loads((tmp_path / "paramserver" / FILE).read_text())["steps"] == {"actor-0": 3_000, "actor-1": 2_000}
    with replay_and_paramserver(cfg):
        # actor-0 kept running (its total again: nothing counted twice); actor-1 restarted (counts from 0)
        assert beat(address, "actor-0", 3_500) == 5_500
        assert beat(address, "actor-1", 100) == 5_600


def test_the_table_round_trips_and_is_written_only_when_it_changed(tmp_path: Path) -> None:
    path = tmp_path / FILE
    registry = Registry(5.0)
    store = StepCountsFile(str(path), registry, every_s=10.0)
    store.tick(0.0)
    assert not path.exists()  # nothing reported yet: nothing to keep
    registry.report_steps("a", 100)
    registry.report_steps("a", 40)  # a restart: 100 kept
    registry.report_steps("b", 7)
    store.tick(1.0)  # not due yet
    assert not path.exists()
    store.tick(10.0)
    written = path.stat().st_mtime_ns
    registry.report_steps("b", 7)  # the same total: no change
    store.tick(20.0)
    assert path.stat().st_mtime_ns == written
    again = Registry(5.0)
    StepCountsFile(str(path), again).restore()
    assert again.fleet_env_steps == registry.fleet_env_steps == 147
    assert again.step_counts() == {"steps": {"a": 40, "b": 7}, "before_restart": {"a": 100}}


@pytest.mark.parametrize("text", ["{not json", '{"steps": {"a": -5}, "before_restart": {}}',
                                  '{"steps": {"a": 1.5}, "before_restart": {}}', '{"steps": []}', "[1, 2]"])
def test_a_table_that_cannot_be_read_is_logged_and_counting_starts_at_0(
        text: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / FILE
    path.write_text(text)
    registry = Registry(5.0)
    with caplog.at_level(logging.ERROR):
        StepCountsFile(str(path), registry).restore()
    assert registry.fleet_env_steps == 0 and registry.step_counts() == {"steps": {}, "before_restart": {}}
    assert str(path) in caplog.text and "counting env steps from 0" in caplog.text
    assert path.read_text() == text  # left for an operator to look at
