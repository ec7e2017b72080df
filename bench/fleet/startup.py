"""Start-up of `rlfleet up`: seconds from the command to a fleet that learns.

    .venv/bin/python -m bench.fleet.startup [--runs 3] [--actors 2] [--config configs/cartpole-dqn.yaml]

Each run launches `rlfleet up` from cold (a fresh interpreter, a fresh run
directory) and polls every member's /healthz every 20 ms (health only: cheap)
to time, from the launch:

- ``healthy_s``: every member answers /healthz with ok (what the launcher waits for);
- ``first_version_s``: paramserver shard 0 holds a weights version (the learner's first publish);
- ``first_step_s``: an actor has stepped its env;
- ``first_insert_s``: replay shard 0 stores a transition;
- ``first_update_s``: the learner has done an update (after replay's min_size);
- ``stop_s``: SIGINT to the launcher until it exited with every member stopped.

Reference, measured in the same run: the floor that any fleet of fresh
processes pays, ``floor_1_s`` = one bare ``python -c "import torch, gymnasium,
zmq"``, and ``floor_parallel_s`` = as many of them at once as the fleet has
members that run torch (learner, actors, evaluator) on the same cores.

Modes (``--modes``, both by default, interleaved run by run): ``fork``, the
members forked by the launcher's fork servers (cli/forkserver.py, the
default); ``fresh``, every member a fresh interpreter (``RLFLEET_FORKSERVER=0``,
what `rlfleet up` did before the fork servers). ``--root`` runs the `rlfleet up`
of another checkout (e.g. an older commit) with this benchmark.

Last line: JSON with the medians over the runs per mode,
``ratio_update_to_floor_<mode>`` = first_update_s / floor_1_s, and
``speedup_first_update`` = fresh / fork.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlfleet.cli.fleetview import scrape

ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.02
FLOOR_CMD = [sys.executable, "-c", "import torch, gymnasium, zmq"]
MILESTONES = ("healthy_s", "first_version_s", "first_step_s", "first_insert_s", "first_update_s")


def floor(parallel: int) -> float:
    """Wall seconds for ``parallel`` bare interpreters importing torch, gymnasium and zmq at once."""
    start = time.perf_counter()
    procs = [subprocess.Popen(FLOOR_CMD, cwd=ROOT) for _ in range(parallel)]
    for p in procs:
        if p.wait(120) != 0:
            raise RuntimeError(f"{FLOOR_CMD} failed with {p.returncode}")
    return time.perf_counter() - start


def health(url: str) -> dict[str, Any] | None:
    """A member's /healthz answer if it says ok (cli.fleetview.scrape, health only)."""
    got = scrape(url, health_only=True, timeout_s=1.0)
    return got.health if got.healthy else None


def one_run(config: str, actors: int, timeout_s: float, root: Path = ROOT, fork: bool = True) -> dict[str, Any]:
    runs = Path(tempfile.mkdtemp(prefix="startup-"))
    cmd = [sys.executable, "-m", "rlfleet.cli", "up", "--config", str(root / config), "--actors", str(actors),
           "--runs", str(runs), "--max-seconds", str(timeout_s)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RLFLEET_FORKSERVER": "1" if fork else "0"}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    got: dict[str, Any] = {}

    def mark(key: str) -> None:
        if key not in got:
            got[key] = round(time.perf_counter() - start, 3)

    members: list[dict[str, Any]] = []
    try:
        while len(got) < len(MILESTONES):
            if proc.poll() is not None:
                raise RuntimeError(f"rlfleet up exited ({proc.returncode}) before the fleet learned; see {runs}")
            if time.perf_counter() - start > timeout_s:
                raise RuntimeError(f"no first update within {timeout_s:g} s; see {runs}")
            if not members:
                found = list(runs.glob("*/fleet.json"))
                if found:
                    try:
                        members = json.loads(found[0].read_text())["members"]
                    except (ValueError, KeyError):
                        members = []
                time.sleep(POLL_S)
                continue
            hs = {m["label"]: health(m["url"]) for m in members}  # each member once per poll
            if "healthy_s" not in got and all(h is not None for h in hs.values()):
                mark("healthy_s")
            if "first_version_s" not in got and (hs.get("paramserver-0") or {}).get("versions"):
                mark("first_version_s")
            if "first_step_s" not in got and any((h or {}).get("env_steps", 0) > 0
                                                 for k, h in hs.items() if k.startswith("actor-")):
                mark("first_step_s")
            if "first_insert_s" not in got and sum((hs.get("replay-0") or {}).get("tables", {}).values()) > 0:
                mark("first_insert_s")
            if "first_update_s" not in got and (hs.get("learner") or {}).get("updates", 0) > 0:
                mark("first_update_s")
            time.sleep(POLL_S)
    finally:
        t_stop = time.perf_counter()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        got["stop_s"] = round(time.perf_counter() - t_stop, 3)
    got["exit_code"] = proc.returncode
    got["run_dir"] = str(next(runs.iterdir(), runs))
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/cartpole-dqn.yaml")
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--modes", default="fork,fresh",
                    help="fork: members forked by the fork servers (the default of `rlfleet up`); "
                         "fresh: every member a fresh interpreter (RLFLEET_FORKSERVER=0)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the source tree whose `rlfleet up` runs "
                    "(another checkout, to compare commits on this machine in one run)")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    torch_members = 2 + args.actors  # learner, actors, evaluator
    floors_1, floors_n = [], []
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    floor(1)  # warm the page cache: every figure below is from a warm cache
    for _ in range(args.runs):  # interleaved, so that a burst of load elsewhere hits every figure alike
        floors_1.append(floor(1))
        floors_n.append(floor(torch_members))
        print("floor", round(floors_1[-1], 3), round(floors_n[-1], 3), flush=True)
        for mode in modes:
            runs[mode].append(one_run(args.config, args.actors, args.timeout, args.root, fork=mode == "fork"))
            print(mode, json.dumps(runs[mode][-1]), flush=True)
    result: dict[str, Any] = {"bench": "startup", "actors": args.actors, "runs": args.runs,
                              "root": str(args.root.resolve())}
    for mode in modes:
        result[mode] = {key: round(statistics.median(r[key] for r in runs[mode]), 3)
                        for key in (*MILESTONES, "stop_s")}
        result[mode]["exit_codes"] = [r["exit_code"] for r in runs[mode]]
    result["floor_1_s"] = round(statistics.median(floors_1), 3)
    result["floor_parallel_s"] = round(statistics.median(floors_n), 3)
    result["floor_parallel_n"] = torch_members
    for mode in modes:
        result[f"ratio_update_to_floor_{mode}"] = round(result[mode]["first_update_s"] / result["floor_1_s"], 2)
    if "fork" in modes and "fresh" in modes:
        result["speedup_first_update"] = round(result["fresh"]["first_update_s"] / result["fork"]["first_update_s"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
