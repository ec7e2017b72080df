"""The GPU learner's placement on a real Swarm: the learner service of `rlfleet stack --gpu-learner`,
deployed with `docker stack deploy` on a one-node swarm of this machine's engine.

Its task stays pending while no node carries the ``rlfleet.gpu`` label, and runs on the node once it
is labelled. With ``--gpu-learner reserve`` it also reserves one GPU as a generic resource: this
engine advertises none (no ``--node-generic-resource gpu=...``), so the task stays pending for want
of it even on the labelled node, which shows that Swarm received the reservation the file asks for.
The learner's image runs ``sleep`` in place of the learner (the CUDA image is not built here, and
placement is what is tested); its deploy section and environment are the rendered file's.

The swarm is made for the test and left afterwards; an engine already in a swarm is used only where
it is a manager and no node holds the label, and its node's labels are restored.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.docker_fleet import ROOT, wait_for

pytestmark = pytest.mark.timeout(120)

LABEL = "rlfleet.gpu"
IMAGE = "rlfleet/learner:latest"  # stands in for <tag>-cuda: sleep instead of the learner


class OneNodeSwarm:
    """This engine as a one-node swarm manager: made here (and left by close) unless it is one."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.made = False
        info = client.info().get("Swarm", {})
        if info.get("LocalNodeState") == "active":
            if not info.get("ControlAvailable"):
                pytest.skip("this engine is a swarm worker: the test needs a manager to deploy")
            if any(LABEL in (n.attrs["Spec"].get("Labels") or {}) for n in client.nodes.list()):
                pytest.skip(f"a node of this engine's swarm holds {LABEL} already")
        else:
            client.swarm.init(advertise_addr="127.0.0.1", listen_addr="127.0.0.1:2377")
            self.made = True
        self.node_id = str(client.info()["Swarm"]["NodeID"])
        self.labels = dict(self.node().attrs["Spec"].get("Labels") or {})
        self.stacks: list[str] = []

    def node(self) -> Any:
        return self.client.nodes.get(self.node_id)

    def set_label(self, on: bool) -> None:
        node = self.node()
        spec = node.attrs["Spec"]
        labels = spec.setdefault("Labels", {})
        if on:
            labels[LABEL] = "true"
        else:
            labels.pop(LABEL, None)
        node.update(spec)

    def deploy(self, stack_file: Path) -> str:
        name = f"rlfleetgpu{uuid.uuid4().hex[:6]}"
        self.stacks.append(name)
        proc = subprocess.run(["docker", "stack", "deploy", "--resolve-image", "never", "-c", str(stack_file), name],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return name

    def close(self) -> None:
        try:
            for name in self.stacks:
                subprocess.run(["docker", "stack", "rm", name], capture_output=True, timeout=60)
            if not self.made:
                node = self.node()
                spec = node.attrs["Spec"]
                spec["Labels"] = self.labels
                node.update(spec)
        finally:
            if self.made:
                self.client.swarm.leave(force=True)


@pytest.fixture
def swarm(docker_client: Any) -> Iterator[OneNodeSwarm]:
    pair = OneNodeSwarm(docker_client)
    try:
        yield pair
    finally:
        pair.close()


def learner_stack(tmp_path: Path, *gpu: str) -> tuple[Path, dict[str, Any]]:
    """`rlfleet stack --gpu-learner ...`, cut to its learner service (deploy and environment as written)."""
    out = tmp_path / "stack.yml"
    subprocess.run([sys.executable, "-m", "rlfleet.cli",
                    "stack", "--config", "configs/cartpole-dqn.yaml", "--gpu-learner",
                    *gpu, "-o", str(out)], cwd=ROOT, check=True, capture_output=True, text=True, timeout=120)
    learner = yaml.safe_load(out.read_text())["services"]["learner"]
    rendered = {key: learner[key] for key in ("deploy", "environment")}
    # the image's health check asks the learner's /healthz, which sleep does not answer
    learner = {**rendered, "image": IMAGE, "entrypoint": ["sleep", "600"], "healthcheck": {"disable": True}}
    path = tmp_path / f"learner-{'-'.join(gpu) or 'label'}.yml"
    path.write_text(yaml.safe_dump({"services": {"learner": learner}}))
    return path, rendered


def task(client: Any, stack: str) -> dict[str, Any]:
    """The learner service's one task: state, the scheduler's word on it, node."""
    tasks = client.services.get(f"{stack}_learner").tasks()
    assert len(tasks) == 1, tasks
    status = tasks[0]["Status"]
    return {"state": status["State"], "err": status.get("Err", ""), "node": tasks[0].get("NodeID", "")}


def test_the_gpu_learner_waits_for_a_gpu_node_and_runs_there(swarm: OneNodeSwarm, tmp_path: Path) -> None:
    client = swarm.client
    label_file, rendered = learner_stack(tmp_path)
    assert rendered["deploy"]["placement"]["constraints"] == [f"node.labels.{LABEL} == true"]
    stack = swarm.deploy(label_file)
    # no node has the label: Swarm holds the task back, saying why
    pending = wait_for(lambda: task(client, stack), lambda t: "constraints not satisfied" in t["err"], 20,
                       "the learner's task pending on its placement constraint")
    assert pending["state"] == "pending" and not pending["node"], pending
    swarm.set_label(True)
    running = wait_for(lambda: task(client, stack), lambda t: t["state"] == "running", 40,
                       "the learner's task running once the node is labelled")
    assert running["node"] == swarm.node_id
    env = dict(e.split("=", 1) for e in client.services.get(f"{stack}_learner").attrs["Spec"]["TaskTemplate"]
               ["ContainerSpec"]["Env"])
    assert (env["RLFLEET_LEARNER__DEVICE"], env["NVIDIA_VISIBLE_DEVICES"]) == ("cuda", "all")

    # reserve: one GPU per learner, which this engine does not advertise: pending on the labelled node
    reserve_file, _ = learner_stack(tmp_path, "reserve")
    stack = swarm.deploy(reserve_file)
    spec = client.services.get(f"{stack}_learner").attrs["Spec"]["TaskTemplate"]
    assert spec["Resources"]["Reservations"]["GenericResources"] == [
        {"DiscreteResourceSpec": {"Kind": "gpu", "Value": 1}}]
    assert spec["Placement"]["Constraints"] == [f"node.labels.{LABEL} == true"]
    waiting = wait_for(lambda: task(client, stack), lambda t: "insufficient resources" in t["err"], 20,
                       "the reserving learner's task pending for want of a GPU")
    assert waiting["state"] == "pending" and not waiting["node"], waiting
