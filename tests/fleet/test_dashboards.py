"""The Grafana dashboards: valid for Grafana's file provisioning, and every query of every panel
returns data from a real Prometheus scraping a real fleet.

The Grafana image cannot be pulled everywhere the tests run, so Grafana itself is not started:
the JSON is checked against what its provisioning needs, and each query (Grafana's variables
filled in as it would) is sent to Prometheus' HTTP API. The fleet runs as processes
(`rlfleet up`) scraped by Debian's `prometheus` binary (.ci/run installs it); the compose
variant is in tests/containers/test_containers.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import skips
from harness.grafana_dashboards import (
    DASHBOARDS,
    GRAFANA,
    ROOT,
    empty_queries,
    load,
    panels,
    queries,
    substitute,
    targets_by_job,
)
from rlfleet.cli.status import read_prometheus

# -- provisioning: no services needed -----------------------------------------------------


def provisioned_datasource_uids() -> set[str]:
    uids = set()
    for f in (GRAFANA / "provisioning" / "datasources").glob("*.y*ml"):
        for ds in yaml.safe_load(f.read_text())["datasources"]:
            assert ds.get("uid"), f"{f.name}: datasource {ds.get('name')} has no uid: dashboards cannot name it"
            uids.add(ds["uid"])
    return uids


def grafana_files(spec: dict[str, Any], base: Path = ROOT) -> dict[str, Path]:
    """Grafana's files in a compose or stack file: container path -> file on the deploying machine, from
    its bind mounts (a directory: every file under it) and its swarm configs."""
    svc = spec["services"]["grafana"]
    out: dict[str, Path] = {}
    for volume in svc.get("volumes", []):
        if volume.startswith("./"):
            host, container, *_ = volume.split(":")
            for f in (base / host).rglob("*"):
                if f.is_file():
                    out[f"{container}/{f.relative_to(base / host)}"] = f
    for mount in svc.get("configs", []):
        out[mount["target"]] = base / spec["configs"][mount["source"]]["file"]
    return out


def expected_grafana_files() -> dict[str, Path]:
    """Where Grafana must find each file of deploy/grafana: provisioning/** in its provisioning directory,
    dashboards/*.json where the dashboard provider reads."""
    providers = []
    for f in (GRAFANA / "provisioning" / "dashboards").glob("*.y*ml"):
        providers += yaml.safe_load(f.read_text())["providers"]
    assert [p["type"] for p in providers] == ["file"]
    path = providers[0]["options"]["path"]
    out = {f"/etc/grafana/provisioning/{f.relative_to(GRAFANA / 'provisioning')}": f
           for f in (GRAFANA / "provisioning").rglob("*") if f.is_file()}
    out.update({f"{path}/{f.name}": f for f in DASHBOARDS})
    return out


def test_there_are_dashboards_with_queries() -> None:
    assert DASHBOARDS
    assert len(queries()) >= 10


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_has_what_grafana_provisioning_needs(path: Path) -> None:
    dash = load(path)
    assert isinstance(dash.get("title"), str) and dash["title"]
    assert isinstance(dash.get("uid"), str) and 0 < len(dash["uid"]) <= 40, "uid: 1 to 40 characters"
    assert isinstance(dash.get("schemaVersion"), int)
    assert isinstance(dash.get("panels"), list) and dash["panels"]
    uids = provisioned_datasource_uids()
    ids = []
    for p in panels(dash):
        where = f"{path.name}: panel {p.get('id')} {p.get('title')!r}"
        assert isinstance(p.get("id"), int), f"{where}: no integer id"
        ids.append(p["id"])
        assert isinstance(p.get("type"), str), f"{where}: no type"
        grid = p.get("gridPos") or {}
        assert all(isinstance(grid.get(k), int) for k in "hwxy"), f"{where}: gridPos needs h, w, x, y"
        assert grid["x"] + grid["w"] <= 24, f"{where}: wider than Grafana's 24 columns"
        if p["type"] == "row":
            continue
        targets = p.get("targets")
        assert targets, f"{where}: no targets"
        refs = [t.get("refId") for t in targets]
        assert all(refs) and len(set(refs)) == len(refs), f"{where}: refIds missing or repeated: {refs}"
        for holder in (p, *targets):
            ds = holder.get("datasource")
            if ds is None and holder is not p:
                continue  # a target without one uses its panel's
            assert isinstance(ds, dict) and ds.get("uid") in uids, (
                f"{where}: datasource {ds!r} is not one provisioned in deploy/grafana/provisioning ({uids})")
    assert len(set(ids)) == len(ids), f"{path.name}: panel ids repeat: {sorted(ids)}"


@pytest.mark.parametrize("file", ["docker-compose.override.yml", "deploy/stack-monitoring.yml"])
def test_grafana_gets_every_provisioning_file_and_dashboard_where_it_reads_them(file: str) -> None:
    spec = yaml.safe_load((ROOT / file).read_text())
    got = {target: path.resolve() for target, path in grafana_files(spec).items()}
    assert got == {target: path.resolve() for target, path in expected_grafana_files().items()}
    home = spec["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home in got and got[home].suffix == ".json"


def test_the_swarm_stack_needs_no_checkout_on_the_node() -> None:
    """Swarm: Grafana's files are swarm configs (read where `docker stack deploy` runs), not bind mounts
    of a checkout the core node would need."""
    svc = yaml.safe_load((ROOT / "deploy/stack-monitoring.yml").read_text())["services"]["grafana"]
    assert not [v for v in svc.get("volumes", []) if v.startswith(("./", "/"))]


def test_variables_are_filled_as_grafana_does() -> None:
    values = {"__rate_interval": "1m", "service": "actor"}
    assert substitute('rate(x{service="$service"}[$__rate_interval])', values) == 'rate(x{service="actor"}[1m])'
    assert substitute("${service:regex} [[service]]", values) == "actor actor"
    with pytest.raises(KeyError):
        substitute("$unknown", values)


# -- every query against a real Prometheus -------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(fetch: Any, ok: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fetch()
            if ok(last):
                return last
        except Exception as exc:  # not up yet
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s; last seen: {last!r}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


# A short run: small table, quick updates, an evaluation every 1,000 fleet env steps.
FLEET_ENV = {
    "RLFLEET_REPLAY__TABLES__0__CAPACITY": "20000",
    "RLFLEET_REPLAY__TABLES__0__MIN_SIZE": "200",
    "RLFLEET_ALGORITHM__BATCH_SIZE": "32",
    "RLFLEET_ALGORITHM__HIDDEN": "[64, 64]",
    "RLFLEET_EVALUATOR__EPISODES": "2",
    "RLFLEET_EVALUATOR__EVERY_STEPS": "1000",
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """`rlfleet up` with 2 actors; yields its run directory and fleet.json members."""
    tmp = tmp_path_factory.mktemp("fleet")
    env = {**os.environ, **FLEET_ENV, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "rlfleet.cli", "up", "--config", "configs/cartpole-dqn.yaml", "--actors", "2",
           "--max-seconds", "400", "--runs", str(tmp / "runs")]
    with open(tmp / "up.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        fleet_json = wait_for(lambda: next((tmp / "runs").glob("*/fleet.json")), bool, 120, "fleet.json")
        yield fleet_json.parent, yaml.safe_load(fleet_json.read_text())["members"]
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def prometheus(fleet: tuple[Path, list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's prometheus scraping every member of the fleet each second, one job a service."""
    binary = shutil.which("prometheus")
    if binary is None:
        skips.missing("prometheus", "no prometheus binary on PATH")
    tmp = tmp_path_factory.mktemp("prometheus")
    jobs: dict[str, list[str]] = {}
    for m in fleet[1]:
        jobs.setdefault(m["service"], []).append(m["url"].split("://", 1)[1].rstrip("/"))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": job, "static_configs": [{"targets": urls}]}
                                 for job, urls in jobs.items()]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(tmp / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def send_malformed_message(run_dir: Path) -> None:
    """One undecodable message to the replay: it counts a protocol error (and keeps serving)."""
    import zmq

    endpoint = yaml.safe_load((run_dir / "config.yaml").read_text())["network"]["replay"][0]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"\xc1 not a header", b"junk"])
        time.sleep(0.5)
    finally:
        sock.close()


@pytest.mark.e2e
def test_every_dashboard_query_returns_series_from_a_running_fleet(
    fleet: tuple[Path, list[dict[str, Any]]], prometheus: str
) -> None:
    run_dir, members = fleet
    wanted = {m["service"]: sum(x["service"] == m["service"] for x in members) for m in members}
    wait_for(lambda: targets_by_job(prometheus),
             lambda h: {j: len(v) for j, v in h.items()} == wanted and all(x == "up" for v in h.values() for x in v),
             180, f"Prometheus scrapes every member up ({wanted})")
    # Prometheus as `rlfleet status --compose` reads it.
    reading = read_prometheus(prometheus)
    assert reading.healthy and reading.samples == {"targets_up": len(members), "targets": len(members)}
    send_malformed_message(run_dir)
    empty = wait_for(lambda: empty_queries(prometheus), lambda e: not e, 300,
                     "every dashboard query returns at least one series")
    assert empty == []
