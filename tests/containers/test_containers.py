"""Containers for real: compose with monitoring, scaling, crash restarts, Prometheus, swarm.

Needs a Docker engine and the images (`make images`; built here when missing).
In CI (CI=true) a missing engine fails the run; elsewhere these tests skip
with the reason. What needs no engine: tests/containers/test_container_files.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.docker_fleet import (
    A3C_CONFIG,
    CONFIGS,
    PONG_CONFIG,
    PONG_ENV,
    PPO_CONFIG,
    PPO_ENV,
    ROOT,
    SAC_CONFIG,
    SAC_ENV,
    SERVICES,
    SHORT_ENV,
    ComposeProject,
    SwarmStack,
    compose_environ,
    compose_project,
    free_port,
    healthz,
    metrics,
    swarm_stack,
    wait_for,
    write_env_file,
)
from harness.grafana_dashboards import empty_queries

STARTUP_S = 300  # first start on a loaded 2-core machine: torch import in 5 containers at once


# -- with an engine ---------------------------------------------------------------------



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
    cmd = [sys.executable, "-m", "rlfleet.cli", "status", "--compose", project.name, "--json", "--interval", "0"]

    def status() -> tuple[int, list[dict[str, Any]]]:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        return proc.returncode, json.loads(proc.stdout or "[]")

    code, rows = wait_for(status, lambda r: r[0] == 0, 60, "rlfleet status exits 0 (every member healthy)")
    prometheus = [r for r in rows if r["service"] == "prometheus"]
    assert len(prometheus) == 1 and prometheus[0]["healthy"], rows
    assert prometheus[0]["url"].endswith(":9090") and prometheus[0]["figures"] == "targets up 8/8", prometheus
    # the modeler idles without planning (planners: 0 replicas unless scaled)
    assert sorted(r["service"] for r in rows if r["service"] != "grafana") == sorted(
        ["replay", "paramserver", "learner", "evaluator", "modeler", "prometheus", *["actor"] * 3])


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


# What makes an env in the image: every experiment file, as compose gives it, probed and acted on.
_ACT_IN_IMAGE = (
    "import json, sys\n"
    "from rlfleet.common.config import load\n"
    "from rlfleet.common.envs import acting_policy\n"
    "for path in sys.argv[2:]:\n"
    "    cfg = load(path, environ=json.loads(sys.argv[1]))\n"
    "    acting_policy(cfg)\n"
    "    print(path, cfg.algorithm.name, cfg.env.id, flush=True)\n"
)


@pytest.mark.container
def test_every_shipped_config_makes_its_env_and_policy_in_the_actor_image(docker_client: Any) -> None:
    """Mounted as RLFLEET_CONFIG, each file under configs/ must find what its env needs in the image
    (LunarLander: box2d and pygame, which gymnasium's box2d package imports) and its algorithm."""
    paths = [f"/etc/rlfleet/configs/{p.name}" for p in CONFIGS]
    out = docker_client.containers.run(
        "rlfleet/actor:latest", ["-c", _ACT_IN_IMAGE, json.dumps(compose_environ()), *paths],
        entrypoint=["python"], remove=True, stderr=True,
        volumes={str(ROOT / "configs"): {"bind": "/etc/rlfleet/configs", "mode": "ro"}})
    made = out.decode().split("\n")
    assert [line.split()[0] for line in made if line] == paths, out.decode()[-3000:]


def check_rounds_advance(fleet: ComposeProject | SwarmStack, actors: int, rounds: int = 5) -> None:
    """PPO on the barrier: the fleet trains (check_fleet_trains), then ``rounds`` more versions while
    every actor's segments are acked and the learner sees their versions and drops none."""
    check_fleet_trains(fleet, actors)
    learner = fleet.one("learner")
    version = learner_progress(learner)[1]
    acked = [metrics(c).get("rlfleet_actor_transitions_acked_total", 0.0) for c in fleet.containers("actor")]
    m = wait_for(lambda: metrics(learner), lambda m: m.get("rlfleet_learner_version", -1) >= version + rounds,
                 STARTUP_S, f"{rounds} more barrier rounds")
    assert m.get("rlfleet_learner_item_staleness_count", 0) > 0, "the learner saw no item's version"
    assert m.get("rlfleet_learner_items_dropped_total", -1) == 0, "barrier rounds drop no segment"
    now = [metrics(c).get("rlfleet_actor_transitions_acked_total", 0.0) for c in fleet.containers("actor")]
    assert len(now) == actors and all(b > a for a, b in zip(sorted(acked), sorted(now), strict=True)), (acked, now)


def check_evaluates(proj: ComposeProject) -> None:
    wait_for(lambda: metrics(proj.one("evaluator")), lambda m: m.get("rlfleet_evaluations_total", 0) > 0,
             STARTUP_S, "the evaluator scores the policy (deterministic)")


@pytest.mark.container
def test_compose_runs_ppo_from_the_config_variable(docker_client: Any, tmp_path: Path) -> None:
    """RLFLEET_CONFIG=./configs/cartpole-ppo.yaml: DPPO rounds advance in compose."""
    with compose_project(docker_client, tmp_path, PPO_ENV, PPO_CONFIG) as proj:
        check_rounds_advance(proj, 2)
        check_evaluates(proj)


@pytest.mark.container
def test_swarm_stack_three_replicas_train_and_docker_kill_is_replaced(
    docker_client: Any, tmp_path: Path
) -> None:
    with swarm_stack(docker_client, tmp_path, SHORT_ENV, 3) as stack:
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


@pytest.mark.container
def test_swarm_stack_runs_ppo_from_the_config_variable(docker_client: Any, tmp_path: Path) -> None:
    """The stack takes RLFLEET_CONFIG as a swarm config: DPPO rounds advance."""
    with swarm_stack(docker_client, tmp_path, PPO_ENV, 2, PPO_CONFIG) as stack:
        check_rounds_advance(stack, 2)


@pytest.mark.container
def test_compose_runs_sac(docker_client: Any, tmp_path: Path) -> None:
    """RLFLEET_CONFIG=./configs/pendulum-sac.yaml (Box actions, only the actor published): the learner
    updates and the evaluator scores the deterministic policy."""
    with compose_project(docker_client, tmp_path, SAC_ENV, SAC_CONFIG) as proj:
        check_fleet_trains(proj, 2)
        check_evaluates(proj)


@pytest.mark.slow  # the stack's RLFLEET_CONFIG is make test's swarm PPO test; SAC's containers its compose test
@pytest.mark.container
def test_swarm_runs_sac(docker_client: Any, tmp_path: Path) -> None:
    """The same SAC config as a Swarm stack: the learner updates."""
    with swarm_stack(docker_client, tmp_path, SAC_ENV, 2, SAC_CONFIG) as stack:
        check_fleet_trains(stack, 2)


@pytest.mark.container
def test_compose_runs_pong_on_pixels(docker_client: Any, tmp_path: Path) -> None:
    """RLFLEET_CONFIG=./configs/pong-dqn.yaml: the actor image plays Atari (ale-py's ROMs, the
    preprocessing), replay shares frames, the learner's CNN updates and the evaluator scores games."""
    with compose_project(docker_client, tmp_path, PONG_ENV, PONG_CONFIG, actors=1) as proj:
        check_fleet_trains(proj, 1)
        check_evaluates(proj)


def check_workers_push(fleet: ComposeProject | SwarmStack, actors: int) -> None:
    """A3C: every actor is a gradient worker whose pushes the paramserver applies; the learner idles."""
    ps = wait_for(lambda: fleet.one("paramserver"), bool, STARTUP_S, "a running paramserver")
    wait_for(lambda: live_actors(ps), lambda n: n == actors, STARTUP_S, f"{actors} live workers at the paramserver")
    first = wait_for(lambda: metrics(ps).get("rlfleet_paramserver_gradients_applied_total", 0), lambda n: n > 0,
                     STARTUP_S, "the paramserver applies gradient pushes")
    wait_for(lambda: [metrics(c).get("rlfleet_worker_pushes_total", 0) for c in fleet.containers("actor")],
             lambda pushes: len(pushes) == actors and all(p > 0 for p in pushes), STARTUP_S, "every worker pushes")
    m = wait_for(lambda: metrics(ps), lambda m: m.get("rlfleet_paramserver_gradients_applied_total", 0) > first + 100,
                 STARTUP_S, "100 more pushes applied")
    assert m.get("rlfleet_paramserver_version", -1) > first
    learner = fleet.one("learner")
    assert learner is not None and "no learner needed" in learner.logs().decode(errors="replace")


@pytest.mark.container
def test_compose_runs_a3c(docker_client: Any, tmp_path: Path) -> None:
    """RLFLEET_CONFIG=./configs/cartpole-a3c.yaml: the actors push gradients to the paramserver's shard
    optimizer and the evaluator scores what it publishes."""
    with compose_project(docker_client, tmp_path, PPO_ENV, A3C_CONFIG) as proj:
        check_workers_push(proj, 2)
        check_evaluates(proj)


@pytest.mark.slow  # the stack's RLFLEET_CONFIG is make test's swarm PPO test; A3C's containers its compose test
@pytest.mark.container
def test_swarm_runs_a3c(docker_client: Any, tmp_path: Path) -> None:
    """The same A3C config as a Swarm stack: every worker pushes and the paramserver applies."""
    with swarm_stack(docker_client, tmp_path, PPO_ENV, 2, A3C_CONFIG) as stack:
        check_workers_push(stack, 2)
