"""Containers against processes: image sizes, cold `up` to the first learner update,
and env steps/s of 3 containerized actors against 3 actors as plain processes
(`rlfleet up`), same config, same machine, same run.

    .venv/bin/python -m bench.fleet.containers      # needs dockerd and `make images`

Last line: JSON with image sizes (MB), cold_up_s, both rates and their ratio.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from harness.docker_fleet import (
    IMAGES,
    ROOT,
    SERVICES,
    SHORT_ENV,
    ComposeProject,
    client_or_reason,
    ensure_images,
    metrics,
    wait_for,
    write_env_file,
)

ACTORS = 3
WARMUP_S = 10.0
WINDOW_S = 30.0
CONFIG = "configs/cartpole-dqn.yaml"


def scrape(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name_labels, _, value = line.rpartition(" ")
                name = name_labels.split("{", 1)[0]
                out[name] = out.get(name, 0.0) + float(value)
    return out


def rate(total: Callable[[], float], window_s: float) -> float:
    t0, s0 = time.monotonic(), total()
    time.sleep(window_s)
    return float((total() - s0) / (time.monotonic() - t0))


def containers(client: object, env_file: Path) -> tuple[float, float]:
    proj = ComposeProject(client, f"rlfleetbench{uuid.uuid4().hex[:6]}", env_file)
    try:
        t0 = time.monotonic()
        proj.up(ACTORS, *SERVICES)
        learner = wait_for(lambda: proj.one("learner"), bool, 120, "learner container")
        wait_for(lambda: metrics(learner), lambda m: m.get("rlfleet_learner_updates_total", 0) > 0, 600,
                 "first learner update")
        cold_up_s = time.monotonic() - t0
        time.sleep(WARMUP_S)
        actors = proj.containers("actor")
        steps = rate(lambda: sum(metrics(c).get("rlfleet_env_steps_total", 0.0) for c in actors), WINDOW_S)
        return cold_up_s, steps
    finally:
        proj.down()


def processes(env_file_env: dict[str, str], tmp: Path) -> float:
    env = {**os.environ, **env_file_env, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "rlfleet.cli", "up", "--config", CONFIG, "--actors", str(ACTORS),
           "--max-seconds", "600", "--runs", str(tmp / "runs")]
    log = open(tmp / "up.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        fleet_json = wait_for(lambda: next((tmp / "runs").glob("*/fleet.json")), bool, 120, "fleet.json")
        members = json.loads(fleet_json.read_text())["members"]
        urls = {m["label"]: m["url"] for m in members}
        actor_urls = [u for label, u in urls.items() if label.startswith("actor")]
        wait_for(lambda: scrape(urls["learner"]), lambda m: m.get("rlfleet_learner_updates_total", 0) > 0, 600,
                 "first learner update (processes)")
        time.sleep(WARMUP_S)
        return rate(lambda: sum(scrape(u).get("rlfleet_env_steps_total", 0.0) for u in actor_urls), WINDOW_S)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def main() -> None:
    client, reason = client_or_reason()
    if client is None:
        sys.exit(f"bench.fleet.containers: {reason}")
    ensure_images(client)
    sizes = {n: round(client.images.get(f"rlfleet/{n}:latest").attrs["Size"] / 1e6) for n in IMAGES}
    print(f"image sizes (MB): {sizes}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        env_file = write_env_file(tmp / "fleet.env", SHORT_ENV)
        cold_up_s, in_containers = containers(client, env_file)
        print(f"containers: cold up to first update {cold_up_s:.1f} s, {in_containers:.0f} env steps/s", flush=True)
        as_processes = processes(SHORT_ENV, tmp)
        print(f"processes: {as_processes:.0f} env steps/s", flush=True)
    print(json.dumps({
        "image_mb": sizes,
        "actor_under_1_5_gb": sizes["actor"] < 1500,
        "cold_up_to_first_update_s": round(cold_up_s, 1),
        "actors": ACTORS,
        "containers_env_steps_per_s": round(in_containers, 1),
        "processes_env_steps_per_s": round(as_processes, 1),
        "ratio": round(in_containers / as_processes, 3) if as_processes > 0 else None,
    }))


if __name__ == "__main__":
    main()
