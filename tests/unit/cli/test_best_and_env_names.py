"""The evaluator's best weights file, a run's name for a command-line env, and what env.id refuses."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from harness.fleet_helpers import CONFIGS
from rlfleet.cli.evaluate import load_for_eval, run_weights
from rlfleet.common.config import load
from rlfleet.common.config.loading import env_run_name
from rlfleet.common.envs import EnvError, custom_env_class, env_factory, has_time_limit, probe_env
from rlfleet.services.actor.best import BestKeeper, best_path


def test_only_a_better_evaluation_replaces_the_best_and_a_restart_remembers_it(tmp_path: Path) -> None:
    cfg = load(str(CONFIGS / "cartpole-dqn.yaml"), [f"run_dir={tmp_path}"])
    w = {"a": np.ones(3, np.float32)}
    keeper = BestKeeper(cfg)
    assert keeper.offer(4, 20.0, 1.0, 5000, w)
    assert not keeper.offer(5, 20.0, 0.0, 6000, {"a": np.zeros(3, np.float32)})  # equal: not better
    assert not keeper.offer(6, 10.0, 0.0, 7000, {"a": np.zeros(3, np.float32)})
    again = BestKeeper(cfg)  # a restarted evaluator
    assert again.best == 20.0 and not again.offer(7, 19.0, 0.0, 8000, w)
    assert again.offer(8, 30.0, 0.0, 9000, {"a": np.full(3, 2.0, np.float32)})
    loaded = load_for_eval(best_path(tmp_path))
    assert loaded.version == 8 and loaded.exact and np.array_equal(loaded.weights["a"], np.full(3, 2.0))
    assert run_weights(tmp_path) == (best_path(tmp_path), "the best evaluation's weights")
    path, what = run_weights(tmp_path, "latest")  # no learner checkpoint, no snapshot: the best, said so
    assert path == best_path(tmp_path) and what.endswith("(the run has no latest)")


def test_a_run_is_named_after_the_env_given_on_the_command_line() -> None:
    assert env_run_name("mymodule:MyPole", "dqn") == "mypole-dqn"
    assert env_run_name("pkg.envs:make_grid", "ppo") == "make-grid-ppo"
    assert env_run_name("ALE/Pong-v5", "dqn") == "pong-dqn"
    path = str(CONFIGS / "cartpole-dqn.yaml")
    assert load(path, ["env.id=LunarLander-v3"]).name == "lunarlander-dqn"
    assert load(path, ["env.id=LunarLander-v3", "name=mine"]).name == "mine"  # a name given stays
    assert load(path, ["env.id=CartPole-v1"]).name == load(path).name  # the file's own env: its name


def test_env_id_refusals_name_the_module_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EnvError, match=r"cannot import module 'no_such_env_module'.*sys.path.*PYTHONPATH"):
        custom_env_class("no_such_env_module:Env")
    (tmp_path / "envmod_for_test.py").write_text("NOT_AN_ENV = 3\ndef broken(**kw):\n    return 5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvError, match="is a int; allowed: a gymnasium.Env subclass or a function"):
        custom_env_class("envmod_for_test:NOT_AN_ENV")
    cfg = load(str(CONFIGS / "cartpole-dqn.yaml"), ["env.id=envmod_for_test:broken"])
    with pytest.raises(EnvError, match="returned a int; allowed: a gymnasium.Env"):
        probe_env(cfg)
    cfg = load(str(CONFIGS / "cartpole-dqn.yaml"), ['env.imports=["no_such_env_module"]'])
    with pytest.raises(EnvError, match="env.imports 'no_such_env_module': cannot import"):
        probe_env(cfg)
    sys.modules.pop("envmod_for_test", None)


def test_an_env_class_without_a_time_limit_is_warned_of_once_and_capped_when_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "endless_env_for_test.py").write_text(
        "from gymnasium.envs.classic_control.cartpole import CartPoleEnv\nclass Pole(CartPoleEnv):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cfg = load(str(CONFIGS / "cartpole-dqn.yaml"), ["env.id=endless_env_for_test:Pole"])
        with caplog.at_level(logging.WARNING, logger="rlfleet.envs"):
            make = env_factory(cfg.env)
            envs = [make(), make()]
        assert not any(has_time_limit(e) for e in envs)
        said = [r.getMessage() for r in caplog.records if "no time limit" in r.getMessage()]
        assert len(said) == 1 and "set env.max_episode_steps" in said[0], said  # once per factory, with the fix
        caplog.clear()
        capped = load(str(CONFIGS / "cartpole-dqn.yaml"), ["env.id=endless_env_for_test:Pole",
                                                          "env.max_episode_steps=7"])
        with caplog.at_level(logging.WARNING, logger="rlfleet.envs"):
            env = env_factory(capped.env)()
        assert has_time_limit(env) and not caplog.records
        env.reset(seed=0)
        steps, term, trunc = 0, False, False
        while not (term or trunc):  # alternating pushes keep the pole up for longer than 7 steps: the cap ends it
            _, _, term, trunc, _ = env.step(1 if steps % 2 else 0)
            steps += 1
        assert steps == 7 and trunc and not term
        assert has_time_limit(gym.make("CartPole-v1"))  # a registered id: its spec's limit
    finally:
        sys.modules.pop("endless_env_for_test", None)
