"""Driving rlfleet containers from tests and bench/fleet/containers.py.

The Docker SDK starts, inspects and kills containers; the compose and stack
CLIs are used only for what the SDK cannot do (compose projects, swarm
stacks). Service state is read from inside each container (``docker exec``
of a tiny urllib script against /healthz and /metrics), which works the same
on a compose bridge network and on a swarm overlay.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rlfleet.common.roles import NAMES

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ("replay", "paramserver", "actor", "learner", "prometheus")
SERVICES = NAMES  # every role is a compose service

# A short run: small table, quick sampling, quick evaluations.
SHORT_ENV = {
    "RLFLEET_REPLAY__DURABILITY": "checkpoint",
    "RLFLEET_REPLAY__TABLES__0__CAPACITY": "20000",
    "RLFLEET_REPLAY__TABLES__0__MIN_SIZE": "200",
    "RLFLEET_ALGORITHM__BATCH_SIZE": "32",
    "RLFLEET_ALGORITHM__HIDDEN": "[64, 64]",
    "RLFLEET_EVALUATOR__EPISODES": "2",
    "RLFLEET_EVALUATOR__EVERY_S": "1",
}

# PPO (DPPO on the barrier): the experiment file as shipped, with fleet.env's durability and short
# evaluations. (SHORT_ENV's algorithm fields are DQN's: PPO refuses options it does not know.)
PPO_CONFIG = "./configs/cartpole-ppo.yaml"
PPO_ENV = {
    "RLFLEET_REPLAY__DURABILITY": "checkpoint",
    "RLFLEET_EVALUATOR__EPISODES": "2",
}

# SAC (async, Pendulum): the experiment file as shipped, short evaluations.
SAC_CONFIG = "./configs/pendulum-sac.yaml"
SAC_ENV = PPO_ENV
A3C_CONFIG = "./configs/cartpole-a3c.yaml"
# Pong on pixels (async DQN, the Nature CNN, shared frames): a small table that starts learning soon,
# time-limited evaluation games.
PONG_CONFIG = "./configs/pong-dqn.yaml"
PONG_ENV = {
    "RLFLEET_REPLAY__TABLES__0__CAPACITY": "3000",
    "RLFLEET_REPLAY__TABLES__0__MIN_SIZE": "500",
    "RLFLEET_ENV__NUM_ENVS": "2",
    "RLFLEET_ENV__MAX_EPISODE_STEPS": "500",
    "RLFLEET_EVALUATOR__EPISODES": "1",
    "RLFLEET_EVALUATOR__EVERY_STEPS": "2000",
    "RLFLEET_LEARNER__PUBLISH_EVERY": "10",
}

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))  # what RLFLEET_CONFIG may name

T = TypeVar("T")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def client_or_reason() -> tuple[Any, str]:
    """(docker client, '') or (None, why docker cannot be used)."""
    try:
        import docker
    except ImportError as exc:
        return None, f"the docker SDK is not installed: {exc}"
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        return None, f"no Docker engine answers ({exc}); start dockerd"
    return client, ""


def ensure_images(client: Any) -> None:
    """Build the images (`make images`, cached) unless every one is there."""
    import docker

    missing = []
    for name in IMAGES:
        try:
            client.images.get(f"rlfleet/{name}:latest")
        except docker.errors.ImageNotFound:
            missing.append(name)
    if missing:
        subprocess.run(["bash", str(ROOT / "deploy" / "build-images.sh")], cwd=ROOT, check=True, timeout=2400)


def compose_environ() -> dict[str, str]:
    """The RLFLEET_ variables compose gives every service: deploy/fleet.env, then the file's environment."""
    lines = (ROOT / "deploy/fleet.env").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    return {**env, **yaml.safe_load((ROOT / "docker-compose.yml").read_text())["x-rlfleet"]["environment"]}


def compose_cli() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return ["docker", "compose"]


def wait_for(fetch: Callable[[], T], ok: Callable[[T], bool], timeout_s: float, what: str, every_s: float = 1.0) -> T:
    """Poll fetch() until ok(value); AssertionError naming what and the last value after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = fetch()
            if ok(last):
                return last
        except Exception as exc:  # a container restarting, an exec racing its exit
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s; last seen: {last!r}")
        time.sleep(every_s)


_FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n"
    "    r = urllib.request.urlopen('http://127.0.0.1:9100' + sys.argv[1], timeout=5)\n"
    "except urllib.error.HTTPError as e:\n"
    "    r = e\n"
    "sys.stdout.write(r.read().decode())\n"
)


def fetch(container: Any, path: str) -> str:
    code, out = container.exec_run(["python", "-c", _FETCH, path], demux=False)
    if code != 0:
        raise RuntimeError(f"{container.name}: GET {path} failed: {out.decode(errors='replace')[-300:]}")
    return str(out.decode())


def healthz(container: Any) -> dict[str, Any]:
    return dict(json.loads(fetch(container, "/healthz")))


def metrics(container: Any) -> dict[str, float]:
    """Samples of /metrics summed over labels, by sample name (e.g. rlfleet_env_steps_total)."""
    out: dict[str, float] = {}
    for line in fetch(container, "/metrics").splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def write_env_file(path: Path, env: Mapping[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return path


class ComposeProject:
    """One compose project (its own name, so it never touches another's containers)."""

    def __init__(self, client: Any, name: str, env_file: Path, prometheus_port: int = 9090,
                 config: str | None = None) -> None:
        self.client = client
        self.name = name
        self.env = {**os.environ, "RLFLEET_ENV_FILE": str(env_file),
                    "RLFLEET_PROMETHEUS_PORT": str(prometheus_port), "COMPOSE_PROJECT_NAME": name}
        if config is not None:  # the experiment file, as a user chooses it (RLFLEET_CONFIG)
            self.env["RLFLEET_CONFIG"] = config

    def run(self, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        cmd = [*compose_cli(), "-p", self.name, "--profile", "monitoring", *args]
        proc = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
        return proc

    def up(self, actors: int, *services: str) -> None:
        self.run("up", "-d", "--no-recreate", "--scale", f"actor={actors}", *services)

    def containers(self, service: str | None = None, all: bool = False) -> list[Any]:
        labels = [f"com.docker.compose.project={self.name}"]
        if service:
            labels.append(f"com.docker.compose.service={service}")
        return list(self.client.containers.list(all=all, filters={"label": labels}))

    def one(self, service: str) -> Any:
        found = self.containers(service)
        if len(found) != 1:
            raise RuntimeError(f"{len(found)} running {service} containers in {self.name}")
        return found[0]

    def down(self, volumes: bool = True) -> None:
        """Stop and remove the containers (SIGTERM first, 20 s grace); with ``volumes``, the named volumes too
        (checkpoints, snapshots): without, a later :meth:`up` resumes from them, as a user's `down` + `up`."""
        self.run("down", *(["-v"] if volumes else []), "--remove-orphans", "-t", "20", timeout_s=300)


class SwarmStack:
    """A swarm stack on this node; init/leave the swarm only if it was not active before."""

    def __init__(self, client: Any, name: str, env_file: Path, config: str | None = None) -> None:
        self.client = client
        self.name = name
        self.env = {**os.environ, "RLFLEET_ENV_FILE": str(env_file)}
        if config is not None:  # the experiment file, as a user chooses it (RLFLEET_CONFIG)
            self.env["RLFLEET_CONFIG"] = config
        self.joined_here = False

    def init(self) -> None:
        state = self.client.info().get("Swarm", {}).get("LocalNodeState")
        if state != "active":
            self.client.swarm.init(advertise_addr="127.0.0.1", listen_addr="127.0.0.1:2377")
            self.joined_here = True
        node = self.client.nodes.list(filters={"role": "manager"})[0]
        spec = node.attrs["Spec"]
        spec.setdefault("Labels", {}).update({"rlfleet.core": "true", "rlfleet.actors": "true"})
        node.update(spec)

    def deploy(self, actors: int) -> None:
        env = {**self.env, "RLFLEET_ACTORS": str(actors)}
        cmd = ["docker", "stack", "deploy", "-c", "docker-compose.yml", self.name]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")

    def containers(self, service: str | None = None) -> list[Any]:
        label = (f"com.docker.swarm.service.name={self.name}_{service}" if service
                 else f"com.docker.stack.namespace={self.name}")
        return list(self.client.containers.list(filters={"label": label, "status": "running"}))

    def one(self, service: str) -> Any:
        found = self.containers(service)
        if len(found) != 1:
            raise RuntimeError(f"{len(found)} running {service} containers in stack {self.name}")
        return found[0]

    def logs(self, lines: int = 15) -> str:
        """The last lines of every container of the stack, exited ones too (for a failure report)."""
        out = []
        for c in self.client.containers.list(all=True, filters={"label": f"com.docker.stack.namespace={self.name}"}):
            text = c.logs(tail=lines).decode(errors="replace")
            out.append(f"--- {c.name} ({c.status}, exit {c.attrs['State'].get('ExitCode')})\n{text}")
        return "\n".join(out)

    def rm(self) -> None:
        subprocess.run(["docker", "stack", "rm", self.name], capture_output=True, timeout=120)
        label = f"com.docker.stack.namespace={self.name}"
        def containers() -> list[Any]:
            return list(self.client.containers.list(all=True, filters={"label": label}))

        wait_for(containers, lambda c: not c, 120, f"containers of stack {self.name} gone")
        for vol in self.client.volumes.list(filters={"label": label}):
            def removed(v: Any = vol) -> bool:
                v.remove(force=True)
                return True

            wait_for(removed, bool, 30, f"volume {vol.name} removed")

    def leave(self) -> None:
        if self.joined_here:
            self.client.swarm.leave(force=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scale_vars(env: Mapping[str, str]) -> dict[str, str]:
    """The variables the compose file itself reads (replicas), not only the services: they must be in
    the environment of docker-compose / docker stack, not only in the env file."""
    return {k: env[k] for k in ("RLFLEET_LEARNERS",) if k in env}


@contextmanager
def compose_project(client: Any, tmp_path: Path, env: dict[str, str], config: str | None = None, *,
                    actors: int = 2, services: Sequence[str] = SERVICES,
                    scale: Mapping[str, int] | None = None) -> Iterator[ComposeProject]:
    """A compose project of ``services`` with ``actors`` actors (and ``scale``: more replicas of others),
    RLFLEET_CONFIG=``config``; every container's last lines printed if the test fails; down afterwards,
    and nothing of it may be left."""
    proj = ComposeProject(client, f"rlfleettest{uuid.uuid4().hex[:8]}", write_env_file(tmp_path / "fleet.env", env),
                          free_port(), config)
    proj.env.update(_scale_vars(env))
    scales = [arg for name, n in (scale or {}).items() for arg in ("--scale", f"{name}={n}")]
    try:
        proj.up(actors, *scales, *services)
        yield proj
    except BaseException:
        for c in proj.containers(all=True):
            print(c.name, c.logs(tail=15).decode(errors="replace"))
        raise
    finally:
        try:
            proj.down()
        finally:
            left = proj.containers(all=True)
            for c in left:
                c.remove(force=True)
    assert not left, f"down left containers: {[c.name for c in left]}"


@contextmanager
def swarm_stack(client: Any, tmp_path: Path, env: dict[str, str], actors: int,
                config: str | None = None) -> Iterator[SwarmStack]:
    """A stack deployed on this node (a swarm made for it if there is none), removed afterwards;
    every container's last lines printed if the test fails."""
    stack = SwarmStack(client, f"rlfleettest{uuid.uuid4().hex[:6]}", write_env_file(tmp_path / "fleet.env", env),
                       config)
    stack.env.update(_scale_vars(env))
    try:
        stack.init()
        stack.deploy(actors=actors)
        yield stack
    except BaseException:
        print(stack.logs())
        raise
    finally:
        try:
            stack.rm()
        finally:
            stack.leave()
    assert stack.containers() == []
