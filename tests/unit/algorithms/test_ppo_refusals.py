"""PPO's bad input, refused by `rlfleet up` and `rlfleet config` as a user meets it: exit 2 with the
field, the value and what is allowed, before any service starts (no run directory is made).

tests/unit/algorithms/test_ppo_config.py checks the same refusals on the config module; this is the command line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.fleet_helpers import CONFIGS, rlfleet

PPO = str(CONFIGS / "cartpole-ppo.yaml")
UNIFORM = "replay.tables=[{name: main, kind: uniform, capacity: 1000, min_size: 1}]"

CASES = {
    "uniform table": (["--set", UNIFORM], ["replay.tables[main].kind='uniform'", "algorithm ppo", "allowed: queue"]),
    "prioritized table": (["--set", UNIFORM.replace("uniform", "prioritized")],
                          ["kind='prioritized'", "allowed: queue"]),
    "segment length 0": (["--set", "algorithm.segment_length=0"],
                         ["algorithm.segment_length = 0", "greater than or equal to 1"]),
    "barrier round does not split": (["--set", "algorithm.minibatch_size=100"],
                                     ["algorithm.minibatch_size=100", "2 * 4 * 32 = 256 steps", "allowed: a divisor"]),
    "--actors decides the round": (["--actors", "3", "--set", "algorithm.minibatch_size=256"],
                                   ["minibatch_size=256", "3 * 4 * 32 = 384 steps", "allowed: a divisor"]),
    "async batch does not split": (["--sync", "async", "--set", "algorithm.minibatch_size=96"],
                                   ["algorithm.minibatch_size=96", "8 * 32 = 256 steps", "allowed: a divisor"]),
    "unknown option": (["--set", "algorithm.clip_rnge=0.1"],
                       ["algorithm.clip_rnge: unknown field", "allowed fields:", "clip_range,"]),
    "a DQN option": (["--set", "algorithm.epsilon=0.1"], ["algorithm.epsilon: unknown field", "segment_length"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_up_refuses_before_starting(case: str, tmp_path: Path) -> None:
    args, words = CASES[case]
    res = rlfleet("up", "--config", PPO, "--runs", str(tmp_path / "runs"), *args, timeout=120)
    assert res.returncode == 2, f"exit {res.returncode}:\n{res.stdout[-3000:]}"
    assert "Traceback" not in res.stdout, res.stdout
    for word in words:
        assert word in res.stdout, (word, res.stdout)
    assert not (tmp_path / "runs").exists(), "a run directory was made for a refused config"


def test_up_refuses_an_action_space_with_infinite_bounds(tmp_path: Path) -> None:
    """Found by making the env (PPO clips actions to the Box, which needs finite bounds)."""
    res = rlfleet("up", "--config", PPO, "--runs", str(tmp_path / "runs"),
                  "--set", "env.id=harness.toy_envs:UnboundedReach", timeout=120)
    assert res.returncode == 2, f"exit {res.returncode}:\n{res.stdout[-3000:]}"
    for word in ("algorithm ppo", "env harness.toy_envs:UnboundedReach", "Box(-inf, inf", "infinite bounds",
                 "allowed: Discrete (starting at 0), or Box with finite low and high"):
        assert word in res.stdout, (word, res.stdout)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("case", ["uniform table", "segment length 0", "barrier round does not split",
                                  "unknown option"])
def test_config_command_refuses(case: str) -> None:
    args, words = CASES[case]
    res = rlfleet("config", "--config", PPO, *args, timeout=60)
    assert res.returncode == 2, f"exit {res.returncode}:\n{res.stdout[-3000:]}"
    for word in words:
        assert word in res.stdout, (word, res.stdout)


def test_config_command_accepts_the_ppo_configs() -> None:
    for name in ("cartpole-ppo.yaml", "lunarlander-ppo.yaml", "lunarlandercontinuous-ppo.yaml"):
        res = rlfleet("config", "--config", str(CONFIGS / name), timeout=60)
        assert res.returncode == 0 and "name: ppo" in res.stdout, res.stdout[-2000:]
