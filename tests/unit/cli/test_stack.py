"""`rlfleet stack`: the stack file for S replay shards, P paramserver shards and N learners, and the
experiment file as a swarm config named by its content (so an edited file rolls the services).

The file is checked as written; deploying it on a real two-node swarm is
tests/containers/test_swarm_two_nodes.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from rlfleet.cli.stack import config_name

ROOT = Path(__file__).resolve().parents[3]
DQN = ROOT / "configs" / "cartpole-dqn.yaml"
PPO = ROOT / "configs" / "cartpole-ppo.yaml"


def rlfleet_stack(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlfleet.cli",
                           "stack", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_two_replay_and_two_paramserver_shards(tmp_path: Path) -> None:
    out = tmp_path / "stack.yml"
    proc = rlfleet_stack(tmp_path, "--config", str(DQN), "--replay-shards", "2", "--paramserver-shards", "2",
                         "--learners", "2", "--actors", "3", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    stack = yaml.safe_load(out.read_text())
    services = stack["services"]
    assert {"replay-0", "replay-1", "paramserver-0", "paramserver-1", "learner", "actor", "evaluator"} <= set(services)
    assert "replay" not in services and "paramserver" not in services
    for role in ("replay", "paramserver"):
        for i in range(2):
            spec = services[f"{role}-{i}"]
            assert spec["command"][-2:] == ["--shard", str(i)]
            assert spec["networks"]["default"]["aliases"] == [role]  # Prometheus finds every shard by the role
            assert spec["deploy"]["placement"]["constraints"] == ["node.labels.rlfleet.core == true"]
    assert services["replay-0"]["volumes"] != services["replay-1"]["volumes"]  # each shard its own snapshots
    env = services["actor"]["environment"]
    assert env["RLFLEET_NETWORK__REPLAY"] == "[tcp://replay-0:5550, tcp://replay-1:5550]"
    assert env["RLFLEET_NETWORK__PARAMSERVER"] == "[tcp://paramserver-0:5560, tcp://paramserver-1:5560]"
    assert (env["RLFLEET_REPLAY__SHARDS"], env["RLFLEET_PARAMSERVER__SHARDS"]) == ("2", "2")
    assert services["learner"]["deploy"]["replicas"] == 2
    assert services["learner"]["environment"]["RLFLEET_LEARNERS"] == "2"
    assert services["actor"]["deploy"]["replicas"] == 3
    assert services["actor"]["deploy"]["placement"]["constraints"] == ["node.labels.rlfleet.actors == true"]
    assert all(s["deploy"]["endpoint_mode"] == "dnsrr" for s in services.values())
    # the config: named by content, read from the experiment file relative to the stack file
    (name, config), = stack["configs"].items()
    assert name == config_name(DQN.read_bytes())
    assert (out.parent / config["file"]).resolve() == DQN.resolve()
    assert all(s["configs"][0]["source"] == name for s in services.values())


def test_an_edited_experiment_file_is_a_new_config_name(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(DQN.read_text())
    first = yaml.safe_load(rlfleet_stack(tmp_path, "--config", str(exp)).stdout)
    exp.write_text(DQN.read_text() + "\nseed: 7\n")
    second = yaml.safe_load(rlfleet_stack(tmp_path, "--config", str(exp)).stdout)
    assert set(first["configs"]) != set(second["configs"])
    assert first["services"]["replay"]["configs"] != second["services"]["replay"]["configs"]


def test_the_env_file_reaches_every_service(tmp_path: Path) -> None:
    env_file = tmp_path / "fleet.env"
    env_file.write_text("# overrides\nRLFLEET_REPLAY__DURABILITY=checkpoint\n\nRLFLEET_EVALUATOR__EPISODES=2\n")
    stack = yaml.safe_load(rlfleet_stack(tmp_path, "--config", str(DQN), "--env-file", str(env_file)).stdout)
    for spec in stack["services"].values():
        assert spec["environment"]["RLFLEET_REPLAY__DURABILITY"] == "checkpoint"
        assert spec["environment"]["RLFLEET_EVALUATOR__EPISODES"] == "2"


def test_a_layout_the_config_refuses_is_refused_with_the_reason(tmp_path: Path) -> None:
    proc = rlfleet_stack(tmp_path, "--config", str(PPO), "--learners", "2")
    assert proc.returncode == 2
    assert "learners=2 with sync=barrier" in proc.stderr and "allowed" in proc.stderr
    proc = rlfleet_stack(tmp_path, "--config", str(DQN), "--replay-shards", "0")
    assert proc.returncode == 2 and "replay shards=0; allowed: 1 or more" in proc.stderr
    bad = tmp_path / "fleet.env"
    bad.write_text("RLFLEET_SEED\n")
    proc = rlfleet_stack(tmp_path, "--config", str(DQN), "--env-file", str(bad))
    assert proc.returncode == 2 and "is not KEY=VALUE" in proc.stderr


def test_monitoring_ships_grafana_files_as_configs_named_by_content(tmp_path: Path) -> None:
    out = tmp_path / "stack.yml"
    assert rlfleet_stack(tmp_path, "--config", str(DQN), "--monitoring", "-o", str(out)).returncode == 0
    stack = yaml.safe_load(out.read_text())
    grafana = stack["services"]["grafana"]
    assert not [v for v in grafana["volumes"] if v.startswith(("./", "/"))], "no bind mount of a checkout"
    shipped = {m["target"]: (out.parent / stack["configs"][m["source"]]["file"]).resolve() for m in grafana["configs"]}
    deploy = ROOT / "deploy" / "grafana"
    assert shipped["/var/lib/grafana/dashboards/rlfleet.json"] == (deploy / "dashboards" / "rlfleet.json").resolve()
    for f in (deploy / "provisioning").rglob("*.yml"):
        assert shipped[f"/etc/grafana/provisioning/{f.relative_to(deploy / 'provisioning')}"] == f.resolve()
    for m in grafana["configs"]:
        assert m["source"] == config_name(shipped[m["target"]].read_bytes(), "grafana")
    assert stack["services"]["prometheus"]["ports"][0]["mode"] == "host"  # answers without the routing mesh


def test_gpu_learner_goes_to_nodes_labelled_gpu_with_the_cuda_image(tmp_path: Path) -> None:
    plain = yaml.safe_load(rlfleet_stack(tmp_path, "--config", str(DQN), "--tag", "v3").stdout)["services"]
    proc = rlfleet_stack(tmp_path, "--config", str(DQN), "--tag", "v3", "--learners", "2", "--gpu-learner")
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    learner = services["learner"]
    assert learner["image"] == "rlfleet/learner:v3-cuda"  # docker-compose.gpu.yml's TORCH=cuda build
    assert learner["deploy"]["placement"]["constraints"] == ["node.labels.rlfleet.gpu == true"]
    assert learner["deploy"]["replicas"] == 2
    assert "resources" not in learner["deploy"]  # a label alone: no reservation Swarm could not meet
    env = learner["environment"]
    assert env["RLFLEET_LEARNER__DEVICE"] == "cuda"
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["NVIDIA_DRIVER_CAPABILITIES"]) == ("all", "compute,utility")
    assert env["RLFLEET_NETWORK__REPLAY"] == plain["learner"]["environment"]["RLFLEET_NETWORK__REPLAY"]
    # only the learner moves: the modeler (same image) stays a CPU service on the core node
    for name, spec in services.items():
        if name != "learner":
            assert spec == plain[name], name
    assert plain["learner"]["image"] == "rlfleet/learner:v3"
    assert plain["learner"]["deploy"]["placement"]["constraints"] == ["node.labels.rlfleet.core == true"]
    assert not {"RLFLEET_LEARNER__DEVICE", "NVIDIA_VISIBLE_DEVICES"} & set(plain["learner"]["environment"])
    assert "devices" not in proc.stdout  # compose's device reservation, which docker stack deploy refuses


def test_gpu_learner_reserve_asks_one_gpu_generic_resource_per_learner(tmp_path: Path) -> None:
    proc = rlfleet_stack(tmp_path, "--config", str(DQN), "--learners", "4", "--gpu-learner", "reserve")
    assert proc.returncode == 0, proc.stderr
    learner = yaml.safe_load(proc.stdout)["services"]["learner"]
    deploy = learner["deploy"]
    assert deploy["placement"]["constraints"] == ["node.labels.rlfleet.gpu == true"]
    # the compose file's form of `docker service create --generic-resource gpu=1`, per replica
    assert deploy["resources"] == {"reservations": {"generic_resources": [
        {"discrete_resource_spec": {"kind": "gpu", "value": 1}}]}}
    assert deploy["replicas"] == 4
    env = learner["environment"]
    assert env["RLFLEET_LEARNER__DEVICE"] == "cuda"
    # the GPU comes from Swarm's DOCKER_RESOURCE_GPU through NVIDIA's runtime, never all of the node's
    assert "NVIDIA_VISIBLE_DEVICES" not in env


def test_gpu_learner_mode_is_checked(tmp_path: Path) -> None:
    proc = rlfleet_stack(tmp_path, "--config", str(DQN), "--gpu-learner", "all")
    assert proc.returncode == 2
    assert "'all' is not one of 'label', 'reserve'" in proc.stderr
