"""`rlfleet status --run` on a finished run says how it ended and exits 0 (real CLI processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.fleet_helpers import ROOT
from rlfleet.common.tboard import read_scalars

CARTPOLE = ROOT / "configs" / "cartpole-dqn.yaml"


def rlfleet(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlfleet.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def only_run(root: Path) -> Path:
    dirs = [d for d in root.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_a_serial_run_that_reached_its_target_says_so(tmp_path: Path) -> None:
    done = rlfleet("train", "--serial", "--config", str(CARTPOLE), "--until-return", "-1", "--max-env-steps", "5000",
                   "--set", "evaluator.every_steps=500", "--set", "evaluator.episodes=2", "--runs", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    run = only_run(tmp_path)
    status = rlfleet("status", "--run", str(run))
    assert status.returncode == 0, status.stderr
    assert "finished, target reached: eval return" in status.stdout and ">= -1 after" in status.stdout
    as_json = json.loads(rlfleet("status", "--run", str(run), "--json").stdout)
    assert as_json["how"] == "target" and 500 <= as_json["env_steps"] < 1000 and as_json["until_return"] == -1


@pytest.mark.e2e
def test_a_fleet_run_that_spent_its_budget_says_so(tmp_path: Path) -> None:
    done = rlfleet("up", "--config", str(CARTPOLE), "--actors", "1", "--until-return", "475", "--max-env-steps",
                   "2000", "--runs", str(tmp_path))
    assert done.returncode == 3, done.stderr[-2000:]
    run = only_run(tmp_path)
    status = rlfleet("status", "--run", str(run))
    assert status.returncode == 0, status.stderr
    assert "finished, budget spent: env-step budget spent" in status.stdout
    assert "before eval return 475" in status.stdout and "exit code 3" in status.stdout
    # the actor's training returns went to TensorBoard too
    assert read_scalars(run / "tensorboard" / "actor-0").get("actor/episode_return")


def test_an_ending_that_is_not_one_is_refused_with_the_file_named(tmp_path: Path) -> None:
    (tmp_path / "ending.json").write_text('{"how": "exploded"}')
    status = rlfleet("status", "--run", str(tmp_path))
    assert status.returncode == 2
    assert "ending.json: not an rlfleet run ending" in status.stderr
