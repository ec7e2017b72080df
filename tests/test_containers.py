"""Containers for real: compose with monitoring, scaling, crash restarts, Prometheus, swarm.

Needs a Docker engine and the images (`make images`; built here when missing).
In CI (CI=true) a missing engine fails the run; elsewhere these tests skip
with the reason. The fast checks at the top need no engine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docker_fleet import (
    ROOT,
    SERVICES,
    SHORT_ENV,
    ComposeProject,
    SwarmStack,
    client_or_reason,
    ensure_images,
    healthz,
    in_ci,
    metrics,
    wait_for,
    write_env_file,
)
from tests.grafana_dashboards import empty_queries
from tests.grafana_dashboards import queries as dashboard_queries

STARTUP_S = 300  # first start on a loaded 2-core machine: torch import in 5 containers at once


# -- fast checks: no engine needed --------------------------------------------------------


def test_image_requirements_match_pyproject_pins() -> None:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = {p.split("==")[0].lower(): p for p in pins}
    lines = (ROOT / "deploy/docker/requirements.txt").read_text().splitlines()
    reqs = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert reqs
    for req in reqs:
        assert pinned.get(req.split("==")[0].lower()) == req, f"{req} differs from pyproject.toml"
    torch_pin = pinned["torch"].split("==")[1]
    assert f"torch=={torch_pin}" in (ROOT / "deploy/docker/install-deps.sh").read_text()


def test_torch_free_images_can_start_their_services() -> None:
    """The replay and paramserver images carry no torch: the CLI must not import it for them."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch': raise ImportError('torch is not in this image')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import importlib, cli.main, cli.dispatch, common.roles\n"
        "for s in ('replay', 'paramserver'): importlib.import_module(common.roles.role(s).entry)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_compose_file_scales_and_is_a_valid_stack() -> None:
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name in SERVICES:
        svc = base["services"][name]
        assert "image" in svc, f"{name}: swarm needs image:"
        assert isinstance(svc.get("depends_on", []), list), f"{name}: swarm accepts only list depends_on"
        assert "profiles" not in svc
    actor = base["services"]["actor"]
    assert "container_name" not in actor and "ports" not in actor
    override = yaml.safe_load((ROOT / "docker-compose.override.yml").read_text())
    assert override["services"]["learner"]["depends_on"]["replay"]["condition"] == "service_healthy"
    for name in ("prometheus", "grafana"):
        assert override["services"][name]["profiles"] == ["monitoring"]


def test_compose_builds_the_targets_of_the_one_dockerfile() -> None:
    """Every image is a target of ./Dockerfile; torch-free targets come before the torch stage, so the
    legacy builder (which builds every stage above the target) never installs torch for them."""
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.M | re.I)
    assert not list(ROOT.glob("services/*/Dockerfile"))
    files = [yaml.safe_load((ROOT / f).read_text()) for f in ("docker-compose.yml", "docker-compose.gpu.yml")]
    for name, svc in [(n, s) for f in files for n, s in f["services"].items() if "build" in s]:
        assert svc["build"]["target"] == name and "dockerfile" not in svc["build"], name
    for name in ("replay", "paramserver", "learner", "actor"):
        assert name in stages, f"the Dockerfile has no target {name}"
    assert max(stages.index("replay"), stages.index("paramserver")) < stages.index("deps-torch")


def test_the_images_hold_the_packages_their_entry_point_needs() -> None:
    """The source stage copies each package the .dockerignore lets in, the entry point's among them."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = re.findall(r"^COPY (\w+)/ /app/\1/$", dockerfile, re.M)
    allowed = (ROOT / ".dockerignore").read_text().splitlines()
    assert copied and all(f"!{pkg}/" in allowed for pkg in copied), (copied, allowed)
    module = re.search(r'^ENTRYPOINT \["python", "-m", "([\w.]+)"\]$', dockerfile, re.M)
    assert module and module[1].split(".")[0] in copied
    path = ROOT / module[1].replace(".", "/")
    assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), module[1]


def test_grafana_provisioning_points_at_prometheus() -> None:
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    exprs = " ".join(q for _, _, q in dashboard_queries())
    for needed in ("rlfleet_env_steps_total", "rlfleet_learner_updates_total", "rlfleet_replay_size",
                   "rlfleet_rate_limiter_wait_seconds_total", "rlfleet_eval_return", "rlfleet_weights_staleness",
                   "rlfleet_protocol_errors_total", "rlfleet_replay_wal_failures_total"):
        assert needed in exprs


# -- with an engine ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def docker_client() -> Any:
    client, reason = client_or_reason()
    if client is None:
        if in_ci():
            pytest.fail(f"CI=true but Docker is unusable: {reason}. .ci/run installs and starts it.")
        pytest.skip(f"Docker is unavailable here: {reason}")
    ensure_images(client)
    return client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def project(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeProject]:
    env_file = write_env_file(tmp_path_factory.mktemp("compose") / "fleet.env", SHORT_ENV)
    proj = ComposeProject(docker_client, f"rlfleettest{uuid.uuid4().hex[:8]}", env_file, free_port())
    try:
        # Grafana's image cannot be pulled on an offline machine: start it only when it is here.
        services = [*SERVICES, "prometheus"]
        try:
            docker_client.images.get(os.environ.get("RLFLEET_GRAFANA_IMAGE", "grafana/grafana-oss:11.4.0"))
            services.append("grafana")
        except Exception:
            pass
        proj.up(3, *services)
        yield proj
    finally:
        try:
            proj.down()
        finally:
            left = proj.containers(all=True)
            for c in left:
                c.remove(force=True)
        assert not left, f"down left containers: {[c.name for c in left]}"


def live_actors(container: Any) -> int:
    return int(healthz(container).get("live_actors", -1))


def distinct_actor_ids(containers: list[Any]) -> set[str]:
    return {healthz(c)["actor_id"] for c in containers}


def learner_progress(container: Any) -> tuple[float, float]:
    m = metrics(container)
    return m.get("rlfleet_learner_updates_total", 0.0), m.get("rlfleet_learner_version", -1.0)


def check_fleet_trains(fleet: ComposeProject | SwarmStack, actors: int) -> None:
    """N distinct actors registered, the learner's updates and version advancing."""
    ps = wait_for(lambda: fleet.one("paramserver"), bool, STARTUP_S, "a running paramserver")
    wait_for(lambda: live_actors(ps), lambda n: n == actors, STARTUP_S, f"{actors} live actors at the paramserver")
    ids = wait_for(lambda: distinct_actor_ids(fleet.containers("actor")), lambda s: len(s) == actors,
                   STARTUP_S, f"{actors} distinct actor ids")
    assert all(i.startswith("actor-") for i in ids)
    learner = wait_for(lambda: fleet.one("learner"), bool, STARTUP_S, "a running learner")
    first = wait_for(lambda: learner_progress(learner), lambda p: p[0] > 0 and p[1] >= 0, STARTUP_S,
                     "first learner update")
    wait_for(lambda: learner_progress(learner), lambda p: p[0] > first[0] and p[1] > first[1], STARTUP_S,
             "learner updates and weights version advance")


def prometheus_get(port: int, path: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def target_health(port: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for t in prometheus_get(port, "/api/v1/targets?state=active")["activeTargets"]:
        out.setdefault(t["labels"]["job"], []).append(t["health"])
    return out


def all_up_with(actors: int) -> Any:
    def ok(h: dict[str, list[str]]) -> bool:
        every = all(v == "up" for vs in h.values() for v in vs)
        return every and len(h.get("actor", [])) == actors and all(len(h.get(s, [])) == 1 for s in
                                                                    ("replay", "paramserver", "learner", "evaluator"))
    return ok


def prometheus_port(proj: ComposeProject) -> int:
    return int(proj.env["RLFLEET_PROMETHEUS_PORT"])


@pytest.mark.container
def test_compose_three_actors_register_and_train(project: ComposeProject) -> None:
    assert len(project.containers("actor")) == 3
    check_fleet_trains(project, 3)
    evaluator = project.one("evaluator")
    m = wait_for(lambda: metrics(evaluator), lambda m: m.get("rlfleet_evaluations_total", 0) > 0, STARTUP_S,
                 "the evaluator reports an evaluation")
    assert "rlfleet_eval_return" in m


@pytest.mark.container
def test_prometheus_scrapes_every_service_and_dashboard_metrics_exist(project: ComposeProject) -> None:
    import zmq

    port = prometheus_port(project)
    wait_for(lambda: target_health(port), all_up_with(3), STARTUP_S, "every target up, 3 actors")
    # A malformed message: the replay counts a protocol error (and keeps serving).
    replay = project.one("replay")
    ip = next(iter(replay.attrs["NetworkSettings"]["Networks"].values()))["IPAddress"]
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://{ip}:5550")
    sock.send_multipart([b"\xc1 not a header", b"junk"])
    try:
        wait_for(lambda: empty_queries(f"http://127.0.0.1:{port}"), lambda empty: not empty, STARTUP_S,
                 "every query of every dashboard panel returns a series")
    finally:
        sock.close()
    assert healthz(replay)["ok"]


@pytest.mark.container
def test_status_of_the_compose_project_reads_prometheus_on_its_own_port(project: ComposeProject) -> None:
    """`rlfleet status --compose` as a user runs it: Prometheus healthy with every target up, not
    'down unreachable' (it listens on 9090 and has no rlfleet /healthz)."""
    wait_for(lambda: target_health(prometheus_port(project)), all_up_with(3), STARTUP_S, "every target up, 3 actors")
    cmd = [sys.executable, "-m", "cli", "status", "--compose", project.name, "--json", "--interval", "0"]

    def status() -> tuple[int, list[dict[str, Any]]]:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        return proc.returncode, json.loads(proc.stdout or "[]")

    code, rows = wait_for(status, lambda r: r[0] == 0, 60, "rlfleet status exits 0 (every member healthy)")
    prometheus = [r for r in rows if r["service"] == "prometheus"]
    assert len(prometheus) == 1 and prometheus[0]["healthy"], rows
    assert prometheus[0]["url"].endswith(":9090") and prometheus[0]["figures"] == "targets up 7/7", prometheus
    assert sorted(r["service"] for r in rows if r["service"] != "grafana") == sorted(
        ["replay", "paramserver", "learner", "evaluator", "prometheus", *["actor"] * 3])


@pytest.mark.container
def test_compose_scales_to_five_while_running(project: ComposeProject) -> None:
    project.up(5, "actor")
    assert len(project.containers("actor")) == 5
    ps = project.one("paramserver")
    wait_for(lambda: live_actors(ps), lambda n: n == 5, STARTUP_S, "5 live actors")
    wait_for(lambda: distinct_actor_ids(project.containers("actor")), lambda s: len(s) == 5, STARTUP_S,
             "5 distinct actor ids")
    wait_for(lambda: target_health(prometheus_port(project)), all_up_with(5), STARTUP_S,
             "Prometheus finds the 5 actors by DNS")


@pytest.mark.container
def test_crashed_actor_is_restarted_and_rejoins(project: ComposeProject) -> None:
    """A crash (the service process SIGKILLed): restart: unless-stopped brings it back.

    (`docker kill` counts as a manual stop for the engine's restart policy; the
    swarm test below covers `docker kill`, which swarm replaces with a new task.)
    """
    actors = project.containers("actor")
    victim = actors[0]
    before = healthz(victim)["actor_id"]
    restarts = victim.attrs["RestartCount"]
    os.kill(victim.attrs["State"]["Pid"], signal.SIGKILL)

    def state() -> tuple[int, str]:
        victim.reload()
        return victim.attrs["RestartCount"], victim.status

    wait_for(state, lambda s: s[0] > restarts and s[1] == "running", 120, "the killed actor restarted")
    wait_for(lambda: metrics(victim), lambda m: m.get("rlfleet_env_steps_total", 0) > 0, STARTUP_S,
             "the restarted actor steps again")
    assert healthz(victim)["actor_id"] == before
    ps = project.one("paramserver")
    wait_for(lambda: live_actors(ps), lambda n: n == len(actors), STARTUP_S, "the restarted actor registered")


@pytest.mark.container
def test_compose_down_leaves_nothing(project: ComposeProject) -> None:
    project.down()
    assert project.containers(all=True) == []
    assert project.client.volumes.list(filters={"label": f"com.docker.compose.project={project.name}"}) == []


@pytest.mark.container
def test_swarm_stack_three_replicas_train_and_docker_kill_is_replaced(
    docker_client: Any, tmp_path: Path
) -> None:
    env_file = write_env_file(tmp_path / "fleet.env", SHORT_ENV)
    stack = SwarmStack(docker_client, f"rlfleettest{uuid.uuid4().hex[:6]}", env_file)
    try:
        stack.init()
        stack.deploy(actors=3)
        check_fleet_trains(stack, 3)
        victim = stack.containers("actor")[0]
        victim.kill()
        wait_for(lambda: [c for c in stack.containers("actor") if c.id != victim.id], lambda c: len(c) == 3,
                 STARTUP_S, "swarm replaced the killed actor")
        ps = stack.one("paramserver")
        wait_for(lambda: live_actors(ps), lambda n: n == 3, STARTUP_S, "3 live actors after the replacement")
        wait_for(lambda: [metrics(c).get("rlfleet_env_steps_total", 0) for c in stack.containers("actor")],
                 lambda steps: len(steps) == 3 and all(s > 0 for s in steps), STARTUP_S,
                 "every actor steps, the new one too")
    except BaseException:
        print(stack.logs())
        raise
    finally:
        try:
            stack.rm()
        finally:
            stack.leave()
    assert stack.containers() == []
