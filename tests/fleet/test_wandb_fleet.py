"""logging.wandb in a real fleet, W&B offline: the learner, the evaluator and every actor each leave a W&B
run in the run directory holding the scalars their TensorBoard files hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlfleet
from harness.fleet_helpers import ROOT
from rlfleet.common.tboard import read_scalars
from rlfleet.common.wandb_log import read_offline_scalars


@pytest.mark.e2e
def test_a_fleet_logs_the_same_scalars_to_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")  # logging.wandb_mode left null: W&B's own variable decides
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run = rlfleet.train(ROOT / "configs" / "cartpole-dqn.yaml",
                        {"logging.wandb": True, "evaluator.every_steps": 2000, "actor.count": 2},
                        max_env_steps=8000, runs=tmp_path / "runs", progress=False)
    assert run.ending.how == "budget", run.ending
    name = run.run_dir.name
    wandb_runs = read_offline_scalars(run.run_dir, wait_s=30)
    tb = read_scalars(run.run_dir / "tensorboard")
    actors = sorted(r for r in wandb_runs if r.startswith(f"{name}/actor"))
    assert {f"{name}/learner", f"{name}/evaluator"} <= set(wandb_runs) and len(actors) == 2, sorted(wandb_runs)
    learner, evaluator = wandb_runs[f"{name}/learner"], wandb_runs[f"{name}/evaluator"]
    assert {"learner/loss", "learner/version"} <= set(learner)
    # how many evaluations fit in the 8,000 steps depends on the machine's load (one, under two
    # benchmarks): at least one, and each one W&B holds is the one TensorBoard holds, below
    assert len(evaluator["eval/mean_return"]) >= 1
    for tag, points in [*learner.items(), *evaluator.items()]:  # each service's own TensorBoard holds the same
        want = tb[tag]
        assert [s for s, _ in points] == [s for s, _ in want], tag
        assert np.allclose([v for _, v in points], [v for _, v in want], rtol=1e-6), tag
    returns = [p for a in actors for p in wandb_runs[a].get("actor/episode_return", [])]
    assert len(returns) == len(tb["actor/episode_return"]) > 10
