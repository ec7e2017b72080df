"""The container files checked without an engine: the Dockerfile, the compose files, the images'
requirements, the Grafana provisioning, and every shipped experiment file as compose gives it.

The containers themselves run in tests/containers/test_containers.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from harness.docker_fleet import CONFIGS, ROOT, SERVICES, compose_environ
from harness.grafana_dashboards import queries as dashboard_queries
from rlfleet.common.config import load


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
        "import importlib, rlfleet.cli.main, rlfleet.cli.dispatch, rlfleet.common.roles\n"
        "for s in ('replay', 'paramserver'): importlib.import_module(rlfleet.common.roles.role(s).entry)\n"
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


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_is_valid_as_compose_gives_it(path: Path) -> None:
    """RLFLEET_CONFIG may name any file under configs/: with compose's addresses (one replay, one
    paramserver shard) and fleet.env each must still validate."""
    cfg = load(path, environ=compose_environ())
    assert cfg.network.replay == ["tcp://replay:5550"] and cfg.replay.shards == 1


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
    """The source stage copies each subpackage the .dockerignore lets in into the one package, rlfleet, the
    entry point's among them (the image, like an install, has no top-level `common`)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = re.findall(r"^COPY (\w+)/ /app/rlfleet/\1/$", dockerfile, re.M)
    allowed = (ROOT / ".dockerignore").read_text().splitlines()
    assert sorted(copied) == ["cli", "common", "services"], copied
    assert all(f"!{pkg}/" in allowed for pkg in [*copied, "rlfleet"]), (copied, allowed)
    assert re.search(r"^COPY rlfleet/\*\.py /app/rlfleet/$", dockerfile, re.M)
    assert not re.search(r"^COPY \w+/ /app/\w+/$", dockerfile, re.M)  # nothing else at the top of /app
    module = re.search(r'^ENTRYPOINT \["python", "-m", "([\w.]+)"\]$', dockerfile, re.M)
    assert module and module[1].split(".")[0] == "rlfleet" and module[1].split(".")[1] in copied, module
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
