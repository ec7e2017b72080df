"""`rlfleet up --resume RUN_DIR`: a stopped run goes on in its own directory with its own config; the
learner resumes from its checkpoint (version and update counter), replay from its snapshot, and the run's
env-step and wall counters continue (budgets apply to the totals). `--init-from CHECKPOINT`: a new run
from a checkpoint's weights only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.fleet_helpers import CONFIGS, only_run_dir, read_csv, rlfleet


@pytest.mark.e2e
def test_a_stopped_dqn_run_resumes_with_its_counters(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = rlfleet("up", "--config", str(CONFIGS / "cartpole-dqn.yaml"), "--actors", "1", "--max-env-steps", "3000",
                    "--max-seconds", "200", "--runs", str(runs), timeout=300)
    assert first.returncode == 0, first.stdout[-3000:]
    run_dir = only_run_dir(runs)
    before = read_csv(run_dir / "progress.csv")
    steps_before, wall_before = int(before[-1]["env_steps"]), float(before[-1]["wall_s"])
    assert steps_before >= 3000

    second = rlfleet("up", "--resume", str(run_dir), "--max-env-steps", str(steps_before + 3000),
                     "--max-seconds", "400", "--runs", str(tmp_path / "unused"), timeout=300)
    assert second.returncode == 0, second.stdout[-3000:]
    assert f"(resumed at {steps_before} env steps" in second.stdout, second.stdout[-3000:]
    assert not (tmp_path / "unused").exists()  # no new run directory
    learner_log = (run_dir / "logs" / "learner.log").read_text()
    resumed = re.search(r"resumed from \S+checkpoint.pt at update (\d+), version (\d+)", learner_log)
    assert resumed and int(resumed.group(1)) > 0 and int(resumed.group(2)) > 0, learner_log[-3000:]

    rows = read_csv(run_dir / "progress.csv")
    after = rows[len(before):]
    assert after and list(rows[0]) == list(before[0])  # one header, the rows appended
    assert all(int(r["env_steps"]) >= steps_before and float(r["wall_s"]) > wall_before for r in after)
    assert int(after[-1]["env_steps"]) >= steps_before + 3000
    ending = json.loads((run_dir / "ending.json").read_text())
    assert ending["env_steps"] >= steps_before + 3000 and ending["how"] == "budget", ending
    # run.json keeps the first command's start and puts the resumed command's on the run's clock
    start = json.loads((run_dir / "run.json").read_text())
    assert [wall for _, wall in start["clock"]] == [0.0, wall_before]
    assert start["max_env_steps"] == steps_before + 3000
    # the paramserver's env-step count went on from the first run's (what every_steps and schedules read)
    counts = json.loads((run_dir / "paramserver" / "env-steps.json").read_text())
    fleet_steps = sum(counts["steps"].values()) + sum(counts["before_restart"].values())
    assert fleet_steps > steps_before + 1000, counts

    # --init-from: a new run from those weights only (the learner's optimizer and counters fresh)
    checkpoint = run_dir / "learner" / "checkpoint.pt"
    fresh = rlfleet("up", "--config", str(CONFIGS / "cartpole-dqn.yaml"), "--actors", "1", "--max-env-steps",
                    "1000", "--max-seconds", "200", "--init-from", str(checkpoint), "--runs", str(tmp_path / "new"),
                    timeout=300)
    assert fresh.returncode == 0 and f"weights of {checkpoint} published as version 0" in fresh.stdout, \
        fresh.stdout[-3000:]
    new_dir = only_run_dir(tmp_path / "new")
    log = (new_dir / "logs" / "learner.log").read_text()
    assert "no checkpoint; starting from the fleet's weights version 0" in log, log[-3000:]
    # its env steps count from 0, not on from the run it took the weights of (the actors step through
    # start-up before the first row: on a loaded machine that can exceed the first run's 3,000 and more)
    steps_resumed = int(after[-1]["env_steps"])
    assert "update counter 0" in log and int(read_csv(new_dir / "progress.csv")[0]["env_steps"]) < steps_resumed
    # weights of another network are refused before anything starts
    other = rlfleet("up", "--config", str(CONFIGS / "cartpole-a3c.yaml"), "--init-from", str(checkpoint),
                    "--runs", str(tmp_path / "other"), timeout=120)
    assert other.returncode == 2 and "do not fit this experiment's networks (a3c on CartPole-v1)" in other.stdout, \
        other.stdout[-3000:]


def test_resume_refuses_what_it_cannot_use(tmp_path: Path) -> None:
    res = rlfleet("up", "--resume", str(tmp_path), timeout=60)
    assert res.returncode == 2 and "config.yaml not found" in res.stdout, res.stdout
    res = rlfleet("up", "--resume", str(tmp_path), "--config", str(CONFIGS / "cartpole-dqn.yaml"), timeout=60)
    assert res.returncode == 2 and "one of them" in res.stdout, res.stdout


@pytest.mark.e2e
def test_a_stopped_a3c_run_resumes_from_the_paramservers_snapshot(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = rlfleet("up", "--config", str(CONFIGS / "cartpole-a3c.yaml"), "--actors", "2", "--max-env-steps", "4000",
                    "--max-seconds", "200", "--runs", str(runs), timeout=300)
    assert first.returncode == 0, first.stdout[-3000:]
    run_dir = only_run_dir(runs)
    before = read_csv(run_dir / "progress.csv")
    version_before = int(before[-1]["weights_version"])
    second = rlfleet("up", "--resume", str(run_dir), "--max-env-steps", str(int(before[-1]["env_steps"]) + 2000),
                     "--max-seconds", "400", timeout=300)
    assert second.returncode == 0, second.stdout[-3000:]
    log = (run_dir / "logs" / "paramserver-0.log").read_text()
    restored = re.search(r"version (\d+) and its optimizer state restored", log)
    assert restored and int(restored.group(1)) >= version_before > 0, log[-3000:]
    after = read_csv(run_dir / "progress.csv")[len(before):]
    assert after and int(after[-1]["weights_version"]) > int(restored.group(1))
