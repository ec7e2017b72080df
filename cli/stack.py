"""`rlfleet stack`: a Docker Swarm stack file for S replay shards, P paramserver shards and N learners.

The experiment file travels as a swarm config named by the hash of its content: swarm configs cannot
change under one name, so an edited experiment file is a new config, and ``docker stack deploy`` with
the regenerated file rolls every service onto it (a fixed name fails with "only updates to Labels are
allowed"). The env file's overrides are written into the services' environment, so an edited override
rolls them as well. Placement, restart policy and ``endpoint_mode: dnsrr`` are docker-compose.yml's;
shard i of replay runs as service ``replay-<i>`` (with S > 1), and every shard also answers to the name
``replay`` on the stack's network, so Prometheus' DNS discovery finds them all. docs/operations.md
("Several hosts") walks through its use.

``docker stack deploy`` refuses compose's ``deploy.resources.reservations.devices`` (what
docker-compose.gpu.yml reserves a GPU with), so a GPU learner is placed the Swarm way (``--gpu-learner``,
:func:`gpu_learner`): a node label, and where the GPU nodes' engines advertise their GPUs as generic
resources, a reservation of one per learner.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import yaml

CONFIG_TARGET = "/etc/rlfleet/config.yaml"
RUN_DIR = "/var/lib/rlfleet/run"
PORTS = {"replay": 5550, "paramserver": 5560}
RENDEZVOUS_PORT = 29400
GRAFANA_IMAGE = "grafana/grafana-oss:11.4.0"
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"
GRAFANA_DASHBOARDS = "/var/lib/grafana/dashboards"  # deploy/grafana/provisioning/dashboards/*.yml reads here
GPU_LABEL = "rlfleet.gpu"  # the node label a GPU learner is placed by
GPU_KIND = "gpu"  # the generic resource's kind: dockerd --node-generic-resource gpu=<GPU UUID>, one per GPU
GPU_MODES = ("label", "reserve")


def config_name(content: bytes, kind: str = "config") -> str:
    """A swarm config's name for a file: ``rlfleet-<kind>-`` and its content's SHA-256, 12 hex digits."""
    return f"rlfleet-{kind}-{hashlib.sha256(content).hexdigest()[:12]}"


def grafana_files(grafana_dir: Path) -> dict[str, Path]:
    """Where in Grafana's container each file of ``grafana_dir`` (deploy/grafana) goes: provisioning/**
    under Grafana's provisioning directory, dashboards/*.json where the dashboard provider reads."""
    files = {f"{GRAFANA_PROVISIONING}/{f.relative_to(grafana_dir / 'provisioning')}": f
             for f in sorted((grafana_dir / "provisioning").rglob("*")) if f.is_file()}
    files.update({f"{GRAFANA_DASHBOARDS}/{f.name}": f for f in sorted((grafana_dir / "dashboards").glob("*.json"))})
    if not any(t.startswith(GRAFANA_DASHBOARDS) for t in files):
        raise ValueError(f"{grafana_dir}: no dashboards/*.json; allowed: a directory laid out as deploy/grafana")
    return files


def monitoring(grafana_dir: Path, out_dir: Path, image_prefix: str, tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Prometheus and Grafana (services, configs) on the core node. Grafana's provisioning and dashboards
    travel as swarm configs named by content: the node needs no checkout, and an edited dashboard rolls
    Grafana. Ports are published in host mode: they answer on the core node without the routing mesh."""
    def published(port: int) -> list[dict[str, Any]]:
        return [{"target": port, "published": port, "protocol": "tcp", "mode": "host"}]

    def core() -> dict[str, Any]:
        return {"restart_policy": {"condition": "any", "delay": "2s"},
                "placement": {"constraints": ["node.labels.rlfleet.core == true"]}}

    configs: dict[str, Any] = {}
    mounts = []
    for target, path in grafana_files(grafana_dir).items():
        name = config_name(path.read_bytes(), "grafana")
        configs[name] = {"file": os.path.relpath(path.resolve(), out_dir.resolve())}
        mounts.append({"source": name, "target": target})
    home = next(m["target"] for m in mounts if m["target"].startswith(GRAFANA_DASHBOARDS))
    services = {
        "prometheus": {"image": f"{image_prefix}rlfleet/prometheus:{tag}", "ports": published(9090),
                       "volumes": ["prometheus-data:/var/lib/prometheus"], "deploy": core()},
        "grafana": {"image": GRAFANA_IMAGE, "ports": published(3000), "configs": mounts,
                    "environment": {"GF_AUTH_ANONYMOUS_ENABLED": "true", "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
                                    "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": home},
                    "volumes": ["grafana-data:/var/lib/grafana/data"], "deploy": core()},
    }
    return services, configs


def shard_names(service: str, shards: int) -> list[str]:
    """The service name of each shard: ``replay`` alone, or ``replay-0`` .. ``replay-<S-1>``."""
    return [service] if shards == 1 else [f"{service}-{i}" for i in range(shards)]


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (compose's env_file syntax: # comments and blank lines skipped)."""
    env: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if "=" not in line:
            raise ValueError(f"{path}:{number}: {line!r} is not KEY=VALUE")
        key, value = line.split("=", 1)
        env[key.strip()] = value
    return env


def fleet_environment(replay_shards: int, paramserver_shards: int, learners: int,
                      overrides: Mapping[str, str]) -> dict[str, str]:
    """What every service's environment holds: the env file's overrides, then the addresses of every
    shard (they win: the stack's layout decides them)."""
    def addresses(service: str, shards: int) -> str:
        return "[" + ", ".join(f"tcp://{n}:{PORTS[service]}" for n in shard_names(service, shards)) + "]"

    return {
        # plain TCP over the stack's network, said on purpose (replay and paramserver refuse a bind beyond
        # loopback without it, common/exposure.py); an env file with keys sets RLFLEET_SECURITY__MODE=curve
        "RLFLEET_SECURITY__INSECURE": "true",
        **overrides,
        "RLFLEET_NETWORK__REPLAY": addresses("replay", replay_shards),
        "RLFLEET_NETWORK__PARAMSERVER": addresses("paramserver", paramserver_shards),
        "RLFLEET_REPLAY__SHARDS": str(replay_shards),
        "RLFLEET_PARAMSERVER__SHARDS": str(paramserver_shards),
        "RLFLEET_RUN_DIR": RUN_DIR,
    }


def gpu_learner(mode: str) -> tuple[list[str], dict[str, Any], dict[str, str]]:
    """The learner on a GPU node: (placement constraints, resources, environment) for ``mode``.

    Both modes run the learner on nodes labelled ``rlfleet.gpu=true`` with ``learner.device=cuda``;
    the node's engine runs containers with NVIDIA's runtime by default (Swarm cannot pick a runtime).
    ``label``: every GPU of the node is visible (``NVIDIA_VISIBLE_DEVICES=all``), and learner ranks
    on one node share them (rank i trains on ``cuda:(i mod GPUs)``). ``reserve``: each learner also
    reserves one GPU as a generic resource (``discrete_resource_spec`` of kind ``gpu``): Swarm places
    it only where a GPU is left, and sets ``DOCKER_RESOURCE_GPU`` to the UUID of the one it assigned,
    which NVIDIA's runtime (``swarm-resource = "DOCKER_RESOURCE_GPU"``) makes the container's only
    GPU. No ``NVIDIA_VISIBLE_DEVICES`` is set then: without the runtime's setting the learner sees no
    GPU and stops saying so, rather than share every GPU of the node unseen."""
    if mode not in GPU_MODES:
        raise ValueError(f"--gpu-learner {mode!r}; allowed: {' or '.join(GPU_MODES)}")
    environment = {"RLFLEET_LEARNER__DEVICE": "cuda", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    resources: dict[str, Any] = {}
    if mode == "label":
        environment["NVIDIA_VISIBLE_DEVICES"] = "all"
    else:
        resources = {"reservations": {"generic_resources": [
            {"discrete_resource_spec": {"kind": GPU_KIND, "value": 1}}]}}
    return [f"node.labels.{GPU_LABEL} == true"], resources, environment


def build(config_file: Path, out_dir: Path, *, replay_shards: int = 1, paramserver_shards: int = 1,
          learners: int = 1, actors: int = 2, planners: int = 0, env: Mapping[str, str] | None = None,
          image_prefix: str = "", tag: str = "latest", grafana_dir: Path | None = None,
          gpu: str | None = None) -> dict[str, Any]:
    """The stack file as a mapping. ``config_file`` is referred to relative to ``out_dir`` (docker stack
    deploy reads it from there); ``env`` holds the RLFLEET_ overrides every service gets; ``grafana_dir``
    (deploy/grafana) adds Prometheus and Grafana; ``gpu`` (``label`` or ``reserve``) puts the learner
    on a GPU node with the CUDA image (``<tag>-cuda``), :func:`gpu_learner`."""
    for name, value, least in (("replay shards", replay_shards, 1), ("paramserver shards", paramserver_shards, 1),
                               ("learners", learners, 1), ("actors", actors, 0), ("planners", planners, 0)):
        if value < least:
            raise ValueError(f"{name}={value}; allowed: {least} or more")
    content = config_file.read_bytes()
    environment = fleet_environment(replay_shards, paramserver_shards, learners, env or {})
    config = config_name(content)

    def image(role: str) -> str:
        return f"{image_prefix}rlfleet/{role}:{tag}"

    def deploy(label: str, replicas: int = 1) -> dict[str, Any]:
        return {"endpoint_mode": "dnsrr", "replicas": replicas,
                "restart_policy": {"condition": "any", "delay": "2s"},
                "placement": {"constraints": [f"node.labels.{label} == true"]}}

    def service(role: str, image_role: str, label: str, *, replicas: int = 1, shard: int | None = None,
                volume: str | None = None, alias: str | None = None,
                extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
        command = ["service", role, "--config", CONFIG_TARGET]
        if shard is not None:
            command += ["--shard", str(shard)]
        spec: dict[str, Any] = {
            "image": image(image_role), "command": command, "stop_grace_period": "30s",
            "environment": {**environment, **(extra_env or {})},
            "configs": [{"source": config, "target": CONFIG_TARGET}],
            "deploy": deploy(label, replicas),
        }
        if volume is not None:
            spec["volumes"] = [f"{volume}:{RUN_DIR}/{role}"]
        if alias is not None:
            spec["networks"] = {"default": {"aliases": [alias]}}
        return spec

    services: dict[str, Any] = {}
    volumes: dict[str, Any] = {}
    for role, shards in (("replay", replay_shards), ("paramserver", paramserver_shards)):
        for i, name in enumerate(shard_names(role, shards)):
            volume = f"{name}-snapshots" if role == "replay" else None
            if volume:
                volumes[volume] = {}
            services[name] = service(role, role, "rlfleet.core", shard=i, volume=volume,
                                     alias=role if shards > 1 else None)
    services["learner"] = service("learner", "learner", "rlfleet.core", replicas=learners, volume="learner-checkpoints",
                                  extra_env={"RLFLEET_LEARNERS": str(learners),
                                             "RLFLEET_LEARNER__RENDEZVOUS": f"tcp://learner:{RENDEZVOUS_PORT}"})
    if gpu is not None:
        constraints, resources, gpu_env = gpu_learner(gpu)
        learner = services["learner"]
        learner["image"] = f"{image('learner')}-cuda"  # docker-compose.gpu.yml's tag: the TORCH=cuda build
        learner["environment"].update(gpu_env)
        learner["deploy"]["placement"]["constraints"] = constraints
        if resources:
            learner["deploy"]["resources"] = resources
    services["actor"] = service("actor", "actor", "rlfleet.actors", replicas=actors)
    services["evaluator"] = service("evaluator", "actor", "rlfleet.actors")
    services["modeler"] = service("modeler", "learner", "rlfleet.core", volume="modeler-checkpoints")
    services["planner"] = service("planner", "actor", "rlfleet.actors", replicas=planners)
    volumes.update({"learner-checkpoints": {}, "modeler-checkpoints": {}})
    configs = {config: {"file": os.path.relpath(config_file.resolve(), out_dir.resolve())}}
    if grafana_dir is not None:
        more_services, more_configs = monitoring(grafana_dir, out_dir, image_prefix, tag)
        services.update(more_services)
        configs.update(more_configs)
        volumes.update({"prometheus-data": {}, "grafana-data": {}})
    return {"services": services, "configs": configs, "volumes": volumes}


def check(config_file: Path, stack: Mapping[str, Any]) -> None:
    """Load the experiment file as the services will (the stack's environment applied): a layout the
    config refuses (e.g. paramserver shards with sync=barrier) fails here, not on the swarm."""
    from rlfleet.common import config as config_mod

    environment = stack["services"]["learner"]["environment"]  # the fleet's, and RLFLEET_LEARNERS
    config_mod.load(config_file, environ=environment)


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, exists=True),
              help="the experiment file (YAML) every service runs")
@click.option("--replay-shards", default=1, show_default=True, type=int, help="replay shards (S)")
@click.option("--paramserver-shards", default=1, show_default=True, type=int, help="paramserver shards (P)")
@click.option("--learners", default=1, show_default=True, type=int, help="data-parallel learners (N)")
@click.option("--actors", default=2, show_default=True, type=int, help="actor replicas")
@click.option("--planners", default=0, show_default=True, type=int, help="planner replicas (Dyna-Q)")
@click.option("--env-file", type=click.Path(dir_okay=False, exists=True),
              help="RLFLEET_ overrides for every service (KEY=VALUE lines; default deploy/fleet.env if it exists)")
@click.option("--image-prefix", default="", help="put before rlfleet/<role> (a registry: 'host:5000/')")
@click.option("--tag", default="latest", show_default=True, help="image tag")
@click.option("--monitoring", "grafana_dir", is_flag=False, flag_value="deploy/grafana", default=None,
              type=click.Path(file_okay=False, exists=True),
              help="add Prometheus and Grafana, with Grafana's provisioning and dashboards from this directory "
                   "as swarm configs (--monitoring alone: deploy/grafana)")
@click.option("--gpu-learner", "gpu", is_flag=False, flag_value="label", default=None, type=click.Choice(GPU_MODES),
              help="the learner on nodes labelled rlfleet.gpu=true, CUDA image (<tag>-cuda), learner.device=cuda; "
                   "'reserve' also reserves one GPU per learner as a generic resource of kind gpu "
                   "(--gpu-learner alone: label)")
@click.option("-o", "--output", default="-", show_default=True, type=click.Path(dir_okay=False),
              help="where to write the stack file ('-': stdout)")
def stack(config_path: str, replay_shards: int, paramserver_shards: int, learners: int, actors: int, planners: int,
          env_file: str | None, image_prefix: str, tag: str, grafana_dir: str | None, gpu: str | None,
          output: str) -> None:
    """Write a Docker Swarm stack file for S replay shards, P paramserver shards and N learners."""
    from rlfleet.common.config import ConfigError

    if env_file is None and Path("deploy/fleet.env").is_file():
        env_file = "deploy/fleet.env"
    out_dir = Path.cwd() if output == "-" else Path(output).resolve().parent
    try:
        env = read_env_file(Path(env_file)) if env_file else {}
        spec = build(Path(config_path), out_dir, replay_shards=replay_shards, paramserver_shards=paramserver_shards,
                     learners=learners, actors=actors, planners=planners, env=env, image_prefix=image_prefix,
                     tag=tag, grafana_dir=Path(grafana_dir) if grafana_dir else None, gpu=gpu)
        check(Path(config_path), spec)
    except (ValueError, ConfigError) as exc:
        click.echo(f"rlfleet stack: {exc}", err=True)
        sys.exit(2)
    text = "# written by `rlfleet stack`; deploy: docker stack deploy -c FILE NAME\n" + \
        yaml.safe_dump(spec, sort_keys=False, width=120)
    if output == "-":
        click.echo(text, nl=False)
    else:
        Path(output).write_text(text)
        click.echo(f"{output}: {len(spec['services'])} services, config {next(iter(spec['configs']))}", err=True)
