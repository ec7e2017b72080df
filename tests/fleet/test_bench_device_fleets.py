"""bench.fleet.device's fleet parts on CPU: real `rlfleet up` runs, their figures and the device the
learner's own log names (what the GPU machine's run reads to say the learner trained on CUDA)."""

from __future__ import annotations

import pytest

from bench.fleet import device


@pytest.mark.e2e
@pytest.mark.slow  # 60 s: bench.fleet.device's fleets end to end on CPU; its parts' logic is in tests/unit/bench
@pytest.mark.timeout(900)
def test_fleet_and_a3c_parts_report_rates_and_the_learners_device() -> None:
    got = device.main(["--cpu", "--only", "fleet,a3c", "--fleet-seconds", "12"])
    fleet = got["fleet"]
    assert fleet["learner_device_asked"] == "cpu"
    for algo in ("dqn", "ppo"):
        row = fleet[algo]
        assert row["learner_device"] == "cpu" and row["learner_device_reason"] == "asked", row
        assert row["env_steps_per_s"] > 0 and row["updates_per_s"] > 0, row
    workers = got["a3c"]["workers"]
    assert workers["1"]["env_steps_per_s"] > 0 and workers["4"]["env_steps_per_s"] > 0
    assert got["a3c"]["speedup_4"] == round(workers["4"]["env_steps_per_s"] / workers["1"]["env_steps_per_s"], 2)
    assert "updates" not in got and "pixels" not in got  # --only ran those two parts alone
