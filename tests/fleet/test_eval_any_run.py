"""Every run evaluable: `rlfleet eval RUN_DIR` scores the evaluator's best weights by default, and a run
trained by gradient workers (A3C: no learner checkpoint) from the paramserver's snapshot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.fleet_helpers import CONFIGS, only_run_dir, read_csv, rlfleet


def mean_of(output: str) -> float:
    return float(re.search(r"mean (-?[\d.]+) std", output).group(1))  # type: ignore[union-attr]


@pytest.mark.e2e
def test_an_a3c_run_evaluates_its_best_and_its_paramserver_snapshot(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = rlfleet("up", "--config", str(CONFIGS / "cartpole-a3c.yaml"), "--actors", "2", "--max-env-steps", "12000",
                   "--max-seconds", "300", "--set", "evaluator.every_steps=3000", "--set", "evaluator.episodes=4",
                   "--runs", str(runs), timeout=420)
    assert proc.returncode in (0, 3), proc.stdout[-3000:]
    run_dir = only_run_dir(runs)
    assert not (run_dir / "learner").exists()
    evaluations = read_csv(run_dir / "evaluations.csv")
    assert evaluations, proc.stdout[-3000:]
    best = max(float(r["mean_return"]) for r in evaluations)

    res = rlfleet("eval", str(run_dir), timeout=300)
    assert res.returncode == 0, res.stdout
    assert "the best evaluation's weights" in res.stdout and "evaluator/best.pt" in res.stdout, res.stdout
    assert mean_of(res.stdout) == pytest.approx(best, abs=0.006)  # the same weights, episodes and seeds

    res = rlfleet("eval", str(run_dir), "--which", "latest", timeout=300)
    assert res.returncode == 0, res.stdout
    assert "the paramserver's snapshot" in res.stdout and "shard-0.npz" in res.stdout, res.stdout
    res = rlfleet("eval", "--checkpoint", str(run_dir / "paramserver" / "shard-0.npz"), timeout=300)
    assert res.returncode == 0 and "a3c" in res.stdout, res.stdout

    import rlfleet as api

    policy = api.load_policy(run_dir)
    assert policy.checkpoint.name == "best.pt"
    assert api.evaluate(policy, episodes=4).mean == pytest.approx(best, abs=0.006)


def test_eval_says_what_a_run_directory_lacks(tmp_path: Path) -> None:
    res = rlfleet("eval", str(tmp_path), timeout=60)
    assert res.returncode == 2 and "holds no weights" in res.stdout and "best.pt" in res.stdout, res.stdout
    res = rlfleet("eval", timeout=60)
    assert res.returncode == 2 and "give a RUN_DIR or --checkpoint" in res.stdout, res.stdout
    (tmp_path / "paramserver").mkdir()
    (tmp_path / "paramserver" / "shard-0.npz").write_bytes(b"junk")
    res = rlfleet("eval", str(tmp_path), timeout=60)
    assert res.returncode == 2 and "config.yaml: no such file" in res.stdout, res.stdout
