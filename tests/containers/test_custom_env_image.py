"""Your own env in a container image, built exactly as docs/custom_envs.md says.

The Dockerfile is read from the page's own fenced block (a page that drifts from the images fails
here), built on the real actor image with a user's module beside it, and the image trains on the
module's env class: `rlfleet train --serial` inside the container (the actor image carries the
learner's code and torch), and the actor service makes the env as `service actor` would.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.docker_fleet import ROOT

pytestmark = pytest.mark.container

MODULE = '''
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class MyPole(CartPoleEnv):
    """A user's env class, known to no image."""
'''


def dockerfile_from_docs() -> str:
    page = (ROOT / "docs" / "custom_envs.md").read_text()
    blocks = re.findall(r"```dockerfile\n(.*?)```", page, re.S)
    assert len(blocks) == 1, "docs/custom_envs.md shows one Dockerfile for an image with your env"
    return blocks[0]


def test_an_image_built_as_the_docs_say_trains_on_the_users_env_class(docker_client: Any,
                                                                       tmp_path: Path) -> None:
    dockerfile = dockerfile_from_docs()
    command = re.search(r"^# Dockerfile\.myenv: (docker build .*)$", dockerfile, re.M)
    assert command, dockerfile
    (tmp_path / "Dockerfile.myenv").write_text(dockerfile)
    (tmp_path / "mymodule.py").write_text(MODULE)
    tag = f"rlfleet-test/actor-myenv:{uuid.uuid4().hex[:8]}"
    argv = command[1].split()
    argv[argv.index("-t") + 1] = tag  # the docs' command, our throwaway tag
    build = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    try:
        train = subprocess.run(
            ["docker", "run", "--rm", tag, "train", "--serial", "--config", "/etc/rlfleet/config.yaml",
             "--env", "mymodule:MyPole", "--set", "env.max_episode_steps=200", "--max-env-steps", "3000",
             "--runs", "/tmp/runs"], capture_output=True, text=True, timeout=300)
        assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
        said = train.stdout + train.stderr
        assert "/tmp/runs/mypole-dqn-" in said  # named after the user's class
        updates = re.search(r"after \d+ env steps, (\d+) updates", said)
        assert updates and int(updates[1]) > 0, said[-2000:]  # it learned, not only stepped
        # the image without the module: the clean refusal, naming the module and the fix
        bare = subprocess.run(
            ["docker", "run", "--rm", "rlfleet/actor:latest", "config", "--config", "/etc/rlfleet/config.yaml",
             "--set", "env.id=mymodule:MyPole"], capture_output=True, text=True, timeout=300)
        said = bare.stdout + bare.stderr
        assert bare.returncode == 2 and "cannot import module 'mymodule'" in said and "PYTHONPATH" in said, said
        assert "Traceback" not in said
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
