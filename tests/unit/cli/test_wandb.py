"""Weights & Biases beside TensorBoard (logging.wandb): the same scalars, in offline W&B runs read back
from their files; off by default; asked for without the package, refused with how to install it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rlfleet.common import config as config_mod
from rlfleet.common.tboard import read_scalars, scalar_writer
from rlfleet.common.wandb_log import read_offline_scalars

OFFLINE = ("logging.wandb=true", "logging.wandb_mode=offline")


@pytest.fixture(autouse=True)
def wandb_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of W&B's outside the test's directory, and nothing sent anywhere."""
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def experiment(tmp_path: Path, *sets: str) -> config_mod.Experiment:
    return config_mod.load(None, (f"run_dir={tmp_path / 'run-1'}", *sets), environ={})


def test_off_by_default(tmp_path: Path) -> None:
    cfg = experiment(tmp_path)
    assert cfg.logging.wandb is False
    tb = scalar_writer(cfg, "learner")
    assert tb.wandb is None
    tb.add("learner/loss", 1.0, 1)
    tb.close()
    assert not (tmp_path / "run-1" / "wandb").exists()


def test_the_learners_and_evaluators_scalars_reach_wandb_as_tensorboard(tmp_path: Path) -> None:
    cfg = experiment(tmp_path, *OFFLINE)
    learner, evaluator = scalar_writer(cfg, "learner"), scalar_writer(cfg, "evaluator")
    for updates in (10, 20, 30):  # as services/learner/training.py logs them
        learner.add_many({"learner/loss": 1.0 / updates, "learner/version": updates // 10, "learner/q": None},
                         step=updates)
    learner.add("learner/loss", float("nan"), 40)  # skipped by both
    # the evaluator's tags on two axes: weights version and env steps (services/actor/evaluator.py)
    evaluator.add("eval/mean_return_by_version", 21.5, step=3)
    evaluator.add_many({"eval/mean_return": 21.5, "eval/std_return": 2.0}, step=6000)
    evaluator.add("eval/mean_return_by_version", 180.0, step=7)
    evaluator.add_many({"eval/mean_return": 180.0, "eval/std_return": 9.5}, step=14000)
    learner.close()
    evaluator.close()
    run_dir = tmp_path / "run-1"
    runs = read_offline_scalars(run_dir, wait_s=30)
    assert set(runs) == {"run-1/learner", "run-1/evaluator"}
    tb = read_scalars(run_dir / "tensorboard")
    for tag in ("learner/loss", "learner/version"):  # TensorBoard keeps float32
        got, want = runs["run-1/learner"][tag], tb[tag]
        assert [s for s, _ in got] == [s for s, _ in want] and np.allclose([v for _, v in got], [v for _, v in want])
    assert runs["run-1/learner"]["learner/loss"] == [(10, 0.1), (20, 0.05), (30, 1 / 30)]
    assert "learner/q" not in runs["run-1/learner"]
    ev = runs["run-1/evaluator"]
    assert ev["eval/mean_return_by_version"] == [(3, 21.5), (7, 180.0)]
    assert ev["eval/mean_return"] == [(6000, 21.5), (14000, 180.0)]
    assert ev["eval/std_return"] == tb["eval/std_return"]


def test_an_actors_episode_returns_reach_wandb(tmp_path: Path) -> None:
    from rlfleet.common.metrics import ServiceMetrics
    from rlfleet.services.actor.episodes import Episodes

    cfg = experiment(tmp_path, *OFFLINE)
    episodes = Episodes(ServiceMetrics("actor"), 2, False, tmp_path / "episodes.csv", scalar_writer(cfg, "actor-0"))
    done, going = np.array([True, False]), np.array([False, False])
    episodes.step(2, 0, np.array([1.0, 1.0]), going, going)
    episodes.step(4, 0, np.array([2.0, 1.0]), done, going)
    episodes.close()
    assert read_offline_scalars(tmp_path / "run-1", wait_s=30)["run-1/actor-0"]["actor/episode_return"] == [(4, 3.0)]


def test_asked_for_without_the_package_the_config_is_refused_with_how_to_install_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what Python does for a package that cannot import
    with pytest.raises(config_mod.ConfigError) as err:
        experiment(tmp_path, "logging.wandb=true")
    text = str(err.value)
    assert "logging" in text and "wandb package is not installed" in text and "pip install wandb" in text
    assert experiment(tmp_path).logging.wandb is False  # off, nothing is needed
