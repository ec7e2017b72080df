"""A real two-node Docker Swarm: this machine's engine (node A: replay, paramserver, learner) and a
second engine in its own network namespace (node B: actors, evaluator), harness/swarm_nodes.py.

The stack file is written by `rlfleet stack`, the actor image reaches node B by `docker save | docker
load`, and the fleet trains across the overlay network. Then node B loses power (every process of it
SIGKILLed at once) and comes back: the fleet trains again, and what replay acked before the cut is
still there. Last, the actors move to node A (the labels change, the swarm reschedules them) and the
same fleet's env steps/s on one node is measured against the two-node figure. The learner's service
moves from node A to node B, where its volume is empty, and goes on from the fleet's weights. And 25M
parameters published from node B to a paramserver on node A come back byte for byte across the overlay.

Marked ``multinode``: too long for CI's run; `make test-multinode` (`bash .ci/run multinode`, nightly)
runs it (docs/testing.md says when, docs/operations.md shows its last output).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from harness import skips
from harness.docker_fleet import ROOT, SHORT_ENV, metrics, wait_for, write_env_file
from harness.swarm_nodes import HOST, NodeB, TwoNodeSwarm, kernel_has_ipvs, load_image, unavailable

# image copy, first start, a node's death and return, two 60 s windows: more than the suite's 600 s
pytestmark = [pytest.mark.multinode, pytest.mark.timeout(1800)]

STARTUP_S = 420  # torch imported in every container on a loaded 2-core machine, node B's first start
WINDOW_S = 60.0  # env steps/s measured over this
DOWN_S = 20.0  # node B stays dead this long

T = TypeVar("T")


@pytest.fixture
def swarm(docker_client: Any, tmp_path: Path) -> Iterator[tuple[TwoNodeSwarm, Any]]:
    why = unavailable()
    if why is not None:
        skips.missing("root", f"a second Docker engine cannot run here: {why}")
    import docker

    with NodeB(log=tmp_path / "dockerd-b.log") as node_b:
        load_image("rlfleet/actor:latest")
        client_b = docker.DockerClient(base_url=HOST, timeout=120)
        try:
            with TwoNodeSwarm(docker_client, node_b) as pair:
                yield pair, client_b
        except BaseException:
            print(node_b.tail())
            raise
        finally:
            client_b.close()


class TwoNodeStack:
    """A stack deployed from a file `rlfleet stack` wrote; its containers found on both engines."""

    def __init__(self, client_a: Any, client_b: Any, tmp_path: Path) -> None:
        self.clients = {"a": client_a, "b": client_b}
        self.name = f"rlfleettest{uuid.uuid4().hex[:6]}"
        self.file = tmp_path / "stack.yml"
        self.env_file = write_env_file(tmp_path / "fleet.env", SHORT_ENV)

    def write(self, *options: str, config: str = "configs/cartpole-dqn.yaml") -> None:
        """`rlfleet stack` with these options (--actors 2, --replay-shards 2, ...)."""
        cmd = [sys.executable, "-m", "rlfleet.cli", "stack", "--config", config, "--env-file", str(self.env_file),
               *options, "-o", str(self.file)]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=120)

    def deploy(self) -> None:
        proc = subprocess.run(["docker", "stack", "deploy", "-c", str(self.file), self.name], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def containers(self, service: str, node: str | None = None) -> list[Any]:
        found = []
        for which, client in self.clients.items():
            if node not in (None, which):
                continue
            try:
                label = f"com.docker.swarm.service.name={self.name}_{service}"
                found += client.containers.list(filters={"label": label, "status": "running"})
            except Exception:  # node B's engine is down
                continue
        return found

    def one(self, service: str) -> Any:
        found = self.containers(service)
        if len(found) != 1:
            raise RuntimeError(f"{len(found)} running {service} containers")
        return found[0]

    def logs(self, lines: int = 15) -> str:
        out = []
        for which, client in self.clients.items():
            try:
                for c in client.containers.list(all=True, filters={"label": f"com.docker.stack.namespace={self.name}"}):
                    text = c.logs(tail=lines).decode(errors="replace")
                    out.append(f"--- node {which}: {c.name} ({c.status})\n{text}")
            except Exception as exc:
                out.append(f"--- node {which}: {exc}")
        return "\n".join(out)

    def rm(self) -> None:
        subprocess.run(["docker", "stack", "rm", self.name], capture_output=True, timeout=120)
        label = f"com.docker.stack.namespace={self.name}"
        for client in self.clients.values():
            def left(c: Any = client) -> list[Any]:
                return list(c.containers.list(all=True, filters={"label": label}))

            wait_for(left, lambda found: not found, 180, f"containers of stack {self.name} gone")
        for vol in self.clients["a"].volumes.list(filters={"label": label}):
            def removed(v: Any = vol) -> bool:
                v.remove(force=True)
                return True

            wait_for(removed, bool, 60, f"volume {vol.name} removed")


def report(what: str, figures: dict[str, Any]) -> None:
    """One line of figures, as docs/operations.md quotes it."""
    print(f"{what}:", json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}))


@contextmanager
def deployed(stack: TwoNodeStack) -> Iterator[TwoNodeStack]:
    """The stack deployed; its containers' logs printed if the test fails; removed after."""
    try:
        stack.deploy()
        yield stack
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.rm()


def env_steps(stack: TwoNodeStack, node: str) -> float:
    return sum(metrics(c).get("rlfleet_env_steps_total", 0.0) for c in stack.containers("actor", node))


def live_actors(stack: TwoNodeStack) -> int:
    return int(metrics(stack.one("paramserver")).get("rlfleet_paramserver_live_actors", -1))


def learner_updates(stack: TwoNodeStack) -> float:
    return metrics(stack.one("learner")).get("rlfleet_learner_updates_total", 0.0)


def replay_size(stack: TwoNodeStack) -> float:
    """Items replay holds: what it acked (the table's capacity is far off). Not its inserts counter,
    which starts again with a restarted replay: Swarm replaces a task whose health check times out,
    which happens on a loaded machine, and replay comes back from its snapshot."""
    return metrics(stack.one("replay")).get("rlfleet_replay_size", 0.0)


def read(fetch: Callable[[], T], what: str) -> T:
    """fetch() once it answers: a `docker exec` into a busy container can time out once."""
    return wait_for(fetch, lambda _: True, STARTUP_S, what)


def steps_per_s(stack: TwoNodeStack, node: str) -> float:
    first, t0 = read(lambda: env_steps(stack, node), "env steps"), time.monotonic()
    time.sleep(WINDOW_S)
    last, t1 = read(lambda: env_steps(stack, node), "env steps"), time.monotonic()
    return (last - first) / (t1 - t0)


def trains_with_actors_on(stack: TwoNodeStack, node: str, actors: int, what: str) -> None:
    wait_for(lambda: len(stack.containers("actor", node)), lambda n: n == actors, STARTUP_S,
             f"{actors} actors running on node {node} ({what})")
    first = wait_for(lambda: env_steps(stack, node), lambda s: s > 0, STARTUP_S, f"node {node}'s actors step ({what})")
    wait_for(lambda: env_steps(stack, node), lambda s: s > first + 200, STARTUP_S,
             f"node {node}'s actors step on ({what})")
    updates = wait_for(lambda: learner_updates(stack), lambda u: u > 0, STARTUP_S, f"the learner updates ({what})")
    wait_for(lambda: learner_updates(stack), lambda u: u > updates + 20, STARTUP_S,
             f"the learner's updates advance ({what})")


def test_fleet_trains_across_two_nodes_and_survives_node_b_dying(
    swarm: tuple[TwoNodeSwarm, Any], docker_client: Any, tmp_path: Path
) -> None:
    pair, client_b = swarm
    actors = 2
    stack = TwoNodeStack(docker_client, client_b, tmp_path)
    stack.write("--actors", str(actors))
    figures: dict[str, Any] = {"ipvs": kernel_has_ipvs()}
    with deployed(stack):
        trains_with_actors_on(stack, "b", actors, "first start")
        assert not stack.containers("actor", "a"), "an actor ran on node A, which has no actors label"
        assert len(stack.containers("evaluator", "b")) == 1
        figures["two_node_env_steps_per_s"] = steps_per_s(stack, "b")

        # node B loses power; what replay acked stays acked
        held_before = read(lambda: replay_size(stack), "replay's size")
        t_kill = time.monotonic()
        pair.node_b.kill()
        wait_for(lambda: pair.node_state("b"), lambda s: s == "down", STARTUP_S, "the manager sees node B down")
        figures["node_b_seen_down_s"] = time.monotonic() - t_kill
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - t_kill)))
        t_back = time.monotonic()
        pair.node_b.start()
        wait_for(lambda: pair.node_state("b"), lambda s: s == "ready", STARTUP_S, "node B ready again")
        updates_back = read(lambda: learner_updates(stack), "the learner's updates")
        trains_with_actors_on(stack, "b", actors, "after node B came back")
        wait_for(lambda: live_actors(stack), lambda n: n == actors, STARTUP_S, f"{actors} live actors again")
        t_trains = time.monotonic()
        assert read(lambda: learner_updates(stack), "the learner's updates") > updates_back
        figures["kill_to_training_s"] = t_trains - t_kill
        figures["return_to_training_s"] = t_trains - t_back
        held_after = read(lambda: replay_size(stack), "replay's size")
        assert held_after >= held_before, f"replay lost acked items: {held_before} -> {held_after}"

        # the same fleet on one node: the actors' label moves to A, the swarm moves them
        pair.label(core="a", actors="a")
        wait_for(lambda: len(stack.containers("actor", "b")), lambda n: n == 0, STARTUP_S, "actors gone from node B")
        trains_with_actors_on(stack, "a", actors, "actors moved to node A")
        figures["one_node_env_steps_per_s"] = steps_per_s(stack, "a")
        figures["two_node_over_one_node"] = figures["two_node_env_steps_per_s"] / figures["one_node_env_steps_per_s"]
        report("two-node swarm", figures)


def config_of(container: Any) -> str:
    code, out = container.exec_run(["cat", "/etc/rlfleet/config.yaml"])
    assert code == 0, out
    return str(out.decode())


def service_configs(stack: TwoNodeStack, service: str) -> list[str]:
    out = subprocess.run(["docker", "service", "inspect", "-f",
                          "{{range .Spec.TaskTemplate.ContainerSpec.Configs}}{{.ConfigName}} {{end}}",
                          f"{stack.name}_{service}"], capture_output=True, text=True, check=True).stdout
    return out.split()


def test_sharded_stack_trains_across_two_nodes_and_rolls_onto_an_edited_experiment_file(
    swarm: tuple[TwoNodeSwarm, Any], docker_client: Any, tmp_path: Path
) -> None:
    """`rlfleet stack` with 2 replay and 2 paramserver shards: both replay shards store the actors'
    inserts from node B, both paramserver shards hold the learner's versions. Then the experiment file
    is edited and the stack deployed again: the deploy succeeds (a config of a fixed name would be
    refused), every service runs the new file and the fleet trains on."""
    _, client_b = swarm
    stack = TwoNodeStack(docker_client, client_b, tmp_path)
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text((ROOT / "configs/cartpole-dqn.yaml").read_text())
    layout = ("--replay-shards", "2", "--paramserver-shards", "2", "--actors", "2")
    stack.write(*layout, config=str(experiment))
    with deployed(stack):
        trains_with_actors_on(stack, "b", 2, "2 replay and 2 paramserver shards")
        for shard, series, what in (("replay-0", "rlfleet_replay_inserts_total", "stores inserts"),
                                    ("replay-1", "rlfleet_replay_inserts_total", "stores inserts"),
                                    ("paramserver-0", "rlfleet_paramserver_version", "holds a published version"),
                                    ("paramserver-1", "rlfleet_paramserver_version", "holds a published version")):
            def value(s: str = shard, name: str = series) -> float:
                return metrics(stack.one(s)).get(name, -1.0)

            wait_for(value, lambda v: v > 0, STARTUP_S, f"{shard} {what}")
        before = set(service_configs(stack, "learner"))

        edited = experiment.read_text().replace("\nseed: 0\n", "\nseed: 11\n")
        assert edited != experiment.read_text()
        experiment.write_text(edited)
        stack.write(*layout, config=str(experiment))
        stack.deploy()
        after = set(service_configs(stack, "learner"))
        assert after and after != before, f"the learner's config did not change: {before} -> {after}"
        for service in ("replay-0", "replay-1", "paramserver-0", "paramserver-1", "learner", "actor", "evaluator"):
            assert set(service_configs(stack, service)) == after, service
            def texts(s: str = service) -> list[str]:
                return [config_of(c) for c in stack.containers(s)]

            wait_for(texts, lambda found: bool(found) and all("\nseed: 11\n" in t for t in found), STARTUP_S,
                     f"every {service} task runs the edited experiment file")
        updates = read(lambda: learner_updates(stack), "the new learner's updates")
        wait_for(lambda: learner_updates(stack), lambda u: u > updates + 20, STARTUP_S,
                 "the learner trains on after the roll")
        wait_for(lambda: env_steps(stack, "b"), lambda s: s > 0, STARTUP_S, "node B's actors step after the roll")


def paramserver_version(stack: TwoNodeStack) -> float:
    return metrics(stack.one("paramserver")).get("rlfleet_paramserver_version", -1.0)


FROM_FLEET = re.compile(r"learner: no checkpoint; starting from the fleet's weights version (\d+) \(paramserver's "
                        r"newest (\d+)\), update counter (\d+)(?:, the fleet's env steps (\d+))?")


def test_a_learner_moved_to_node_b_goes_on_from_the_fleets_weights(
    swarm: tuple[TwoNodeSwarm, Any], docker_client: Any, tmp_path: Path
) -> None:
    """The learner's service moves from node A to node B (its placement changes, as when A is drained
    or the learner goes to a bigger host), where its named volume is empty: the learner on B finds no
    checkpoint, takes the paramserver's newest weights and the fleet's env steps, and publishes versions
    after it. Never a version from fresh weights: the log says which version it started from, no older
    than the newest the paramserver held before the move, and the fleet trains on."""
    pair, client_b = swarm
    load_image("rlfleet/learner:latest")
    stack = TwoNodeStack(docker_client, client_b, tmp_path)
    stack.write("--actors", "2")
    figures: dict[str, Any] = {}
    with deployed(stack):
        trains_with_actors_on(stack, "b", 2, "first start")
        before = wait_for(lambda: paramserver_version(stack), lambda v: v >= 5, STARTUP_S,
                          "the paramserver holds version 5 or newer")
        assert not stack.containers("learner", "b")

        t_move = time.monotonic()
        out = subprocess.run(["docker", "service", "update", "--detach", "--constraint-rm",
                              "node.labels.rlfleet.core == true", "--constraint-add", f"node.id == {pair.node_b_id}",
                              f"{stack.name}_learner"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        learner_b = wait_for(lambda: stack.containers("learner", "b"), lambda found: len(found) == 1, STARTUP_S,
                             "the learner running on node B")[0]
        assert not stack.containers("learner", "a"), "the learner still runs on node A"

        def started_from() -> re.Match[str] | None:
            return FROM_FLEET.search(learner_b.logs().decode(errors="replace"))

        found = wait_for(started_from, lambda m: m is not None, STARTUP_S, "the moved learner says where it started")
        assert found is not None
        version, newest, update_counter = (int(g) for g in found.groups()[:3])
        assert found.group(4) is not None, f"the fleet's env steps were not recovered from the registry: {found[0]}"
        fleet_steps = int(found.group(4))
        assert version >= before, f"the moved learner started from version {version}, older than {before}"
        assert version == newest
        assert update_counter == 0, "a learner on an empty volume has made no update of its own"
        assert fleet_steps > 0, f"the registry counted no env steps: {found[0]}"
        wait_for(lambda: paramserver_version(stack), lambda v: v > version, STARTUP_S,
                 f"the moved learner publishes after version {version}")
        updates = read(lambda: learner_updates(stack), "the moved learner's updates")
        wait_for(lambda: learner_updates(stack), lambda u: u > updates + 20, STARTUP_S,
                 "the moved learner trains on")
        wait_for(lambda: env_steps(stack, "b"), lambda s: s > 0, STARTUP_S, "node B's actors step on")
        figures["move_to_training_s"] = time.monotonic() - t_move
        figures |= {"version_before": before, "started_from": version, "fleet_env_steps": fleet_steps}
        report("learner moved to node B", figures)


# Publishes 25M float32 parameters (100 MB, 16 tensors: bench.wire.weight_sync's mlp_25m) from node B
# to a paramserver on node A and reads them back over the same overlay: both directions, compared by
# digest. Runs in the actor image (numpy and rlfleet; no torch needed).
OVERLAY_PROBE = """
import hashlib, json, os, time
from pathlib import Path
import numpy as np
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader

def digest(ws):
    h = hashlib.sha256()
    for k in sorted(ws):
        h.update(k.encode())
        h.update(np.ascontiguousarray(ws[k]).tobytes())
    return h.hexdigest()

rng = np.random.default_rng(7)
tensors = {}
for i in range(4):
    for name, shape in (("w1", (2048, 1536)), ("b1", (2048,)), ("w2", (1536, 2048)), ("b2", (1536,))):
        tensors[f"block{i}.{name}"] = rng.standard_normal(shape, dtype=np.float32)
addresses = [f"tcp://{os.environ['PARAMSERVER']}:5560"]
pub = WeightsPublisher(addresses, "overlay-probe", shm=False)
t0 = time.monotonic()
pub.publish(1, tensors, timeout_s=300)
t1 = time.monotonic()
reader = WeightsReader(addresses, "overlay-probe-reader", shm=False, timeout_s=300)
got = reader.get(-1)
t2 = time.monotonic()
version, weights = got
mb = sum(t.nbytes for t in tensors.values()) / 1e6
print("OVERLAY_PROBE " + json.dumps({
    "params": int(sum(t.size for t in tensors.values())), "mb": round(mb, 1), "version": version,
    "same": digest(weights) == digest(tensors), "publish_s": round(t1 - t0, 3), "get_s": round(t2 - t1, 3),
    "publish_mb_per_s": round(mb / (t1 - t0), 1), "get_mb_per_s": round(mb / (t2 - t1), 1),
    "mtu": int(Path("/sys/class/net/eth0/mtu").read_text())}), flush=True)
"""


def test_a_25m_parameter_publish_crosses_the_overlay_both_ways(
    swarm: tuple[TwoNodeSwarm, Any], docker_client: Any, tmp_path: Path
) -> None:
    """A paramserver on node A; from node B, 25M float32 parameters (100 MB in one publish, the
    overlay's MTU below the veth's 1500) are published to it and read back: what arrives on either
    side is byte for byte what was sent. A blackholed large frame would time out here."""
    pair, client_b = swarm
    name = f"rlfleettest{uuid.uuid4().hex[:6]}"
    network, server, probe = f"{name}_net", f"{name}_paramserver", f"{name}_probe"

    def docker(*args: str) -> str:
        out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"docker {' '.join(args)}: {out.stderr}"
        return out.stdout

    docker("network", "create", "--driver", "overlay", network)
    try:
        docker("service", "create", "--detach", "--name", server, "--network", network, "--endpoint-mode", "dnsrr",
               "--constraint", f"node.id == {pair.node_a_id}", "-e", "RLFLEET_SECURITY__INSECURE=true",
               "rlfleet/paramserver:latest", "service", "paramserver", "--config", "/etc/rlfleet/config.yaml")
        docker("service", "create", "--detach", "--name", probe, "--network", network, "--restart-condition",
               "none", "--constraint", f"node.id == {pair.node_b_id}", "-e", f"PARAMSERVER={server}",
               "--entrypoint", "python",
               "rlfleet/actor:latest", "-c", OVERLAY_PROBE)

        def states() -> list[str]:
            out = docker("service", "ps", "--format", "{{.CurrentState}}", probe)
            return [line.split()[0] for line in out.splitlines() if line]

        ended = wait_for(states, lambda s: bool(s) and s[0] in ("Complete", "Failed", "Rejected"), STARTUP_S,
                         "the probe on node B ends")
        logs = "".join(c.logs().decode(errors="replace") for c in
                       client_b.containers.list(all=True, filters={"label": f"com.docker.swarm.service.name={probe}"}))
        assert ended[0] == "Complete", f"the probe {ended[0]}:\n{logs[-3000:]}"
        line = next((ln for ln in logs.splitlines() if ln.startswith("OVERLAY_PROBE ")), None)
        assert line is not None, logs[-3000:]
        figures = json.loads(line.removeprefix("OVERLAY_PROBE "))
        report("25M parameters across the overlay", figures)
        assert figures["params"] >= 25_000_000 and figures["version"] == 1
        assert figures["same"], "the weights read back on node B differ from those published"
        assert figures["mtu"] < 1500, f"the overlay's MTU is {figures['mtu']}: not an overlay?"
    finally:
        for service in (probe, server):
            subprocess.run(["docker", "service", "rm", service], capture_output=True, timeout=120)
        wait_for(lambda: subprocess.run(["docker", "network", "rm", network], capture_output=True).returncode,
                 lambda rc: rc == 0, 120, f"network {network} removed")
