"""Your own env from your own directory: `env.id: module:Class` / `module:function` and `env.imports`,
resolved the same way by `rlfleet up` (every service), `rlfleet train --serial`, `rlfleet.train` and
`rlfleet eval`, run
with the working directory holding the module, and from another directory with it on PYTHONPATH; a
module that does not import is a clean error naming it, sys.path and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.fleet_helpers import CONFIGS, only_run_dir

RLFLEET = str(Path(sys.executable).parent / "rlfleet")  # the console script a user runs

MODULE = '''
import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class MyPole(CartPoleEnv):
    """CartPole under another name: a user's own env class."""


def make_pole(**kwargs):
    return gym.wrappers.TimeLimit(MyPole(**kwargs), 200)


gym.register("MyPole-v0", entry_point=MyPole, max_episode_steps=200)
'''


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RLFLEET, *args], cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    home = tmp_path / "project"
    home.mkdir()
    (home / "mymodule.py").write_text(MODULE)
    return home


@pytest.mark.e2e
def test_an_env_class_from_the_users_directory_trains_serves_and_evaluates(user_dir: Path) -> None:
    config = str(CONFIGS / "cartpole-dqn.yaml")
    # a class has no time limit of its own: without env.max_episode_steps an evaluation of a policy that
    # balances would never end (the run's config keeps it, so `rlfleet eval` below has it too)
    up = cli("up", "--config", config, "--env", "mymodule:MyPole", "--set", "env.max_episode_steps=200",
             "--actors", "1", "--max-env-steps", "1500", "--max-seconds", "200", "--runs", "runs", cwd=user_dir)
    assert up.returncode == 0, up.stdout[-3000:]
    run_dir = only_run_dir(user_dir / "runs")
    assert run_dir.name.startswith("mypole-dqn-"), run_dir  # named after the env class, not the file's env

    serial = cli("train", "--serial", "--config", config, "--set", "env.id=mymodule:make_pole",
                 "--max-env-steps", "600", "--runs", "serial-runs", cwd=user_dir)
    assert serial.returncode == 0, serial.stdout[-3000:]
    assert only_run_dir(user_dir / "serial-runs").name.startswith("make-pole-dqn-")

    api = subprocess.run(  # the Python API, from a script in the user's directory
        [sys.executable, "-c", "import rlfleet; run = rlfleet.train(" + repr(config) + ", {'env.id': "
         "'mymodule:MyPole', 'env.max_episode_steps': 200}, serial=True, max_env_steps=500, progress=False, "
         "runs='api-runs'); print('RUN', run.run_dir.name)"], cwd=user_dir, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=300)
    assert api.returncode == 0 and "RUN mypole-dqn-" in api.stdout, api.stdout[-3000:]

    ev = cli("eval", str(run_dir), "--episodes", "2", cwd=user_dir)
    assert ev.returncode == 0 and "mymodule:MyPole, dqn" in ev.stdout, ev.stdout
    # from another directory: the module's directory on PYTHONPATH, as docs/custom_envs.md says
    elsewhere = user_dir.parent / "elsewhere"
    elsewhere.mkdir()
    ev = cli("eval", str(run_dir), "--episodes", "2", cwd=elsewhere, env={"PYTHONPATH": str(user_dir)})
    assert ev.returncode == 0 and "mymodule:MyPole, dqn" in ev.stdout, ev.stdout
    # without it: a clean error, no traceback
    ev = cli("eval", str(run_dir), "--episodes", "2", cwd=elsewhere)
    assert ev.returncode == 2 and "cannot import module 'mymodule'" in ev.stdout and "PYTHONPATH" in ev.stdout
    assert "Traceback" not in ev.stdout, ev.stdout
    up = cli("up", "--config", config, "--env", "mymodule:MyPole", "--runs", "runs", cwd=elsewhere)
    assert up.returncode == 2 and "cannot import module 'mymodule'" in up.stdout and "sys.path" in up.stdout
    assert "Traceback" not in up.stdout, up.stdout[-3000:]


@pytest.mark.e2e
def test_env_imports_register_an_id_for_every_service(user_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    up = cli("up", "--config", str(CONFIGS / "cartpole-dqn.yaml"), "--set", "env.id=MyPole-v0",
             "--set", 'env.imports=["mymodule"]', "--actors", "1", "--max-env-steps", "1000", "--max-seconds", "200",
             "--runs", "runs", cwd=elsewhere, env={"PYTHONPATH": str(user_dir)})
    assert up.returncode == 0, up.stdout[-3000:]
    assert only_run_dir(elsewhere / "runs").name.startswith("mypole-dqn-")
    bad = cli("up", "--config", str(CONFIGS / "cartpole-dqn.yaml"), "--set", "env.id=MyPole-v0",
              "--set", 'env.imports=["nosuchmodule"]', "--runs", "runs", cwd=elsewhere)
    assert bad.returncode == 2 and "env.imports 'nosuchmodule': cannot import module" in bad.stdout, bad.stdout
