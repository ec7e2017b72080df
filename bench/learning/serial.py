"""The serial runner beside the fleet and Stable-Baselines3: same config, same seeds, same evaluations.

    .venv/bin/python -m bench.learning.serial --algo dqn --env CartPole-v1 [--seeds 3] [--first-seed 0]
    .venv/bin/python -m bench.learning.serial --algo ppo --env CartPole-v1 [--no-fleet] [--no-sb3]
    .venv/bin/python -m bench.learning.serial --algo sac --env Pendulum-v1

Three sides, a seed at a time, in turn (serial, fleet, SB3 for seed 0, then seed 1, ...):
- ``serial``: `rlfleet train --serial` on the shipped config (cli/serial.py): the algorithm's own
  objects in one process, no sockets, every new version loaded at once;
- ``fleet``: `rlfleet up` on the same config (bench.learning.time_to_solve's run, actors from --actors);
- ``sb3``: SB3 with rl-baselines3-zoo's settings for the env (bench/peers/sb3_peers.py, bench/peers/sb3_sac.py).

Each side is scored the same way: the mean return of 10 greedy (or mean-action) episodes every
``EVAL_EVERY`` env steps, the first at or above the target counts; wall seconds run from the command
(start-up included) to that evaluation. A run that does not reach the target within the budget (the
zoo's, on every side) counts at the budget.

What the figures are for:
- ``fleet_over_serial_env_steps``: the env steps the fleet needs over the serial runner's (medians
  over the runs both solved): what the fleet's staleness and pacing cost. Near 1 says the fleet runs
  the algorithm faithfully.
- ``serial_over_sb3_env_steps``: the serial runner's env steps over SB3's: whether the algorithm,
  apart from the fleet, learns as a reference implementation does (same hyperparameters where the
  config takes the zoo's; the configs say where they differ).

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.learning.time_to_solve import CONFIGS, PAIRED, evaluation_curve, run_rlfleet
from bench.peers.sb3_peers import (
    DQN_EVAL_EVERY,
    EVAL_EPISODES,
    PEER_THREADS,
    TARGETS,
    ZOO_DQN,
    run_peer,
    run_sb3_dqn,
)

ROOT = Path(__file__).resolve().parents[2]


def budget_and_interval(algo: str, env_id: str) -> tuple[int, int]:
    """bench.learning.time_to_solve's budget and evaluation interval for the algorithm and env."""
    if algo == "dqn":
        return int(ZOO_DQN[env_id]["n_timesteps"]), DQN_EVAL_EVERY
    budgets, evals, _ = PAIRED[algo]
    return budgets[env_id], evals[env_id]


def run_serial(algo: str, env_id: str, seed: int, budget: int, every: int) -> dict[str, Any]:
    """`rlfleet train --serial` on the shipped config of ``algo`` on ``env_id``."""
    return run_serial_config(ROOT / CONFIGS[algo, env_id], seed, budget, every, TARGETS[env_id])


def run_serial_config(config: Path, seed: int, budget: int, every: int, target: float | None,
                      max_seconds: float | None = None, extra: list[str] | None = None) -> dict[str, Any]:
    """`rlfleet train --serial` of ``config`` as a subprocess; wall seconds from its launch; its evaluation
    curve (:func:`~bench.learning.time_to_solve.evaluation_curve`)."""
    runs = Path(tempfile.mkdtemp(prefix="serial-"))
    cmd = [sys.executable, "-m", "rlfleet.cli", "train", "--serial", "--config", str(config),
           "--max-env-steps", str(budget), "--runs", str(runs),
           "--set", f"seed={seed}", "--set", f"evaluator.every_steps={every}",
           "--set", f"evaluator.episodes={EVAL_EPISODES}"]
    cmd += ["--until-return", str(target)] if target is not None else []
    cmd += ["--max-seconds", str(max_seconds)] if max_seconds else []
    cmd += extra or []
    start, start_epoch = time.perf_counter(), time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    ended = time.perf_counter() - start
    if proc.returncode not in (0, 3):
        raise RuntimeError(f"rlfleet train --serial failed ({proc.returncode}): {proc.stderr[-2000:]}")
    run_dir = next(d for d in runs.iterdir() if d.is_dir())
    result = json.loads((run_dir / "result.json").read_text())
    with open(run_dir / "evaluations.csv", newline="") as f:
        evals = list(csv.DictReader(f))
    hit = next((r for r in evals if target is not None and float(r["mean_return"]) >= target), None)
    wall = float(hit["wall_time"]) - start_epoch if hit else ended
    steps = int(hit["env_steps"]) if hit else int(result["env_steps"])
    return {"seed": seed, "solved": hit is not None, "wall_s": round(wall, 2), "env_steps": steps,
            "updates": int(result["updates"]), "steps_per_wall_s": round(steps / wall, 1) if wall > 0 else 0.0,
            **evaluation_curve(evals, start_epoch)}


def run_sb3(algo: str, env_id: str, seed: int, budget: int) -> dict[str, Any]:
    """The SB3 peer time_to_solve races, with its torch threads."""
    if algo == "dqn":
        return run_peer(run_sb3_dqn, PEER_THREADS["dqn"], env_id, seed, budget)
    return run_peer(PAIRED[algo][2], PEER_THREADS[algo], env_id, seed, budget)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    solved = [r for r in runs if r["solved"]]
    return {"solved": len(solved), "runs": len(runs),
            "median_env_steps": statistics.median(r["env_steps"] for r in runs) if runs else None,
            "median_wall_s": statistics.median(r["wall_s"] for r in runs) if runs else None,
            "env_steps": [r["env_steps"] for r in runs], "wall_s": [r["wall_s"] for r in runs],
            "solved_by_seed": [r["solved"] for r in runs]}


def paired_ratio(top: list[dict[str, Any]], bottom: list[dict[str, Any]], key: str) -> float | None:
    """Median of ``top`` over median of ``bottom`` on the seeds both solved; None if none."""
    both = [(a, b) for a, b in zip(top, bottom, strict=True) if a["solved"] and b["solved"]]
    if not both:
        return None
    return round(statistics.median(a[key] for a, _ in both) / statistics.median(b[key] for _, b in both), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=["dqn", "ppo", "sac"], default="dqn")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--actors", type=int, default=None, help="fleet actors (default: the config's)")
    parser.add_argument("--no-fleet", action="store_true")
    parser.add_argument("--no-sb3", action="store_true")
    args = parser.parse_args()
    if (args.algo, args.env) not in CONFIGS:
        parser.error(f"no shipped config for --algo {args.algo} --env {args.env}")
    budget, every = budget_and_interval(args.algo, args.env)
    from rlfleet.common import config as config_mod

    actors = args.actors or config_mod.load(ROOT / CONFIGS[args.algo, args.env], environ={}).actor.count
    sides: dict[str, list[dict[str, Any]]] = {"serial": [], "fleet": [], "sb3": []}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        sides["serial"].append(run_serial(args.algo, args.env, seed, budget, every))
        print("serial", json.dumps(sides["serial"][-1]), flush=True)
        if not args.no_fleet:
            sides["fleet"].append(run_rlfleet(args.env, seed, actors, budget, [], args.algo, every))
            print("fleet", json.dumps({k: v for k, v in sides["fleet"][-1].items() if k != "run_dir"}), flush=True)
        if not args.no_sb3:
            sides["sb3"].append(run_sb3(args.algo, args.env, seed, budget))
            print("sb3", json.dumps(sides["sb3"][-1]), flush=True)
    result: dict[str, Any] = {"algo": args.algo, "env": args.env, "target": TARGETS[args.env], "budget": budget,
                              "eval_every": every, "actors": actors, "cores": len(os.sched_getaffinity(0)),
                              **{name: summary(runs) for name, runs in sides.items() if runs}}
    if sides["fleet"]:
        result["fleet_over_serial_env_steps"] = paired_ratio(sides["fleet"], sides["serial"], "env_steps")
        result["fleet_over_serial_wall_s"] = paired_ratio(sides["fleet"], sides["serial"], "wall_s")
    if sides["sb3"]:
        result["serial_over_sb3_env_steps"] = paired_ratio(sides["serial"], sides["sb3"], "env_steps")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
