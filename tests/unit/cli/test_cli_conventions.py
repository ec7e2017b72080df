"""CLI conventions (real `python -m rlfleet.cli` processes): --version, --seed and --env on up and train,
`rlfleet config` refusing what `up` refuses, --explain, and "did you mean" for a misspelled key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.fleet_helpers import ROOT

CARTPOLE = str(ROOT / "configs" / "cartpole-dqn.yaml")


def rlfleet(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlfleet.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, check=False)


@pytest.mark.parametrize("command", [[], ["up"], ["train"]])
def test_version(command: list[str]) -> None:
    done = rlfleet(*command, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("rlfleet, version ")


def test_config_refuses_an_unknown_env_id_as_up_does() -> None:
    config = rlfleet("config", "--config", CARTPOLE, "--set", "env.id=CartPole-v9")
    up = rlfleet("up", "--config", CARTPOLE, "--env", "CartPole-v9", "--no-fork-server")
    assert config.returncode == 2 and up.returncode == 2
    line = next(x for x in config.stderr.splitlines() if x.startswith("rlfleet: "))
    assert "CartPole-v9" in line and line in up.stderr
    assert config.stdout == ""  # nothing printed as if it were valid


def test_a_misspelled_key_gets_a_did_you_mean(tmp_path: Path) -> None:
    done = rlfleet("config", "--config", CARTPOLE, "--set", "replay.durabilty=wal")
    assert done.returncode == 2
    assert "replay.durabilty: unknown field; did you mean 'durability'?" in done.stderr
    data = yaml.safe_load(Path(CARTPOLE).read_text())
    data["evaluator"]["episodez"] = 3
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    done = rlfleet("config", "--config", str(path))
    assert done.returncode == 2
    assert "evaluator.episodez: unknown field; did you mean 'episodes'?" in done.stderr


def test_explain_a_field_a_section_and_an_unknown_one() -> None:
    done = rlfleet("config", "--explain", "replay.tables.N.kind")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["replay.tables.N.kind", "  default: 'prioritized'",
                                        "  allowed: uniform | prioritized | queue"]
    lr = rlfleet("config", "--explain", "algorithm.lr").stdout
    assert "algorithm[dqn].lr\n  Adam learning rate\n  default: 0.0005\n  allowed: float (> 0)" in lr
    assert "algorithm[ppo].lr" in lr
    section = rlfleet("config", "--explain", "evaluator").stdout
    assert "evaluator.every_steps\n" in section and "evaluator.episodes\n" in section
    assert "replay." not in section
    every = rlfleet("config", "--explain").stdout
    assert "learners\n" in every and "env.id\n" in every and "security.mode\n" in every
    unknown = rlfleet("config", "--explain", "evaluator.episodez")
    assert unknown.returncode == 2
    assert "no config field 'evaluator.episodez'; did you mean evaluator.episodes" in unknown.stderr


def test_train_seed_and_env_set_the_runs_config(tmp_path: Path) -> None:
    done = rlfleet("train", "--serial", "--config", CARTPOLE, "--seed", "7", "--env", "CartPole-v0",
                   "--max-env-steps", "200", "--runs", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = list(tmp_path.iterdir())
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["seed"] == 7 and cfg["env"]["id"] == "CartPole-v0"


@pytest.mark.e2e
def test_up_seed_and_env_set_the_runs_config(tmp_path: Path) -> None:
    done = rlfleet("up", "--config", CARTPOLE, "--seed", "7", "--env", "CartPole-v0", "--actors", "1",
                   "--max-env-steps", "500", "--runs", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = list(tmp_path.iterdir())
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["seed"] == 7 and cfg["env"]["id"] == "CartPole-v0"
