"""The rlfleet side of bench.learning.time_to_solve's DQN runs, for sweeping the config one change at a time.

    .venv/bin/python -m bench.learning.dqn_sweep --seeds 10 [--actors 2] [--env CartPole-v1] \
        [--set algorithm.n_step=5 --set replay.tables.0.samples_per_insert=64 ...]

Runs ``run_rlfleet`` (the same command, evaluations and budget as bench.learning.time_to_solve --algo dqn)
for seeds 0..N-1 and prints each run, then the solved count, the median env steps to solve (an
unsolved run counts as the budget), the median learner updates done by then, the median wall
seconds (an unsolved run counts as the wall time it took to spend the budget, as
bench.learning.time_to_solve does) and the learner's median updates/s. No SB3 peer: compare its medians
against a peer measured in bench.learning.time_to_solve. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from bench.learning.time_to_solve import run_rlfleet
from bench.peers.sb3_peers import TARGETS, ZOO_DQN


def updates_at(run: dict[str, Any], budget: int) -> int:
    """Learner updates done when the fleet had taken the run's solving env steps (or its budget):
    the first progress.csv row at or past them."""
    steps = run["env_steps"] if run["solved"] else budget
    with open(Path(run["run_dir"]) / "progress.csv", newline="") as f:
        rows = [(float(r["env_steps"]), float(r["updates"])) for r in csv.DictReader(f)]
    return int(next((u for s, u in rows if s >= steps), rows[-1][1] if rows else 0))


def summary(runs: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    steps = [r["env_steps"] if r["solved"] else budget for r in runs]
    updates = [updates_at(r, budget) for r in runs]
    return {
        "solved": sum(r["solved"] for r in runs),
        "runs": len(runs),
        "median_env_steps": float(statistics.median(steps)),
        "median_wall_s": round(float(statistics.median(r["wall_s"] for r in runs)), 2),
        "median_updates": float(statistics.median(updates)),
        "learner_updates_per_s": round(float(statistics.median(r["updates_per_s"] for r in runs)), 1),
        "env_steps": steps,
        "wall_s": [r["wall_s"] for r in runs],
        "updates": updates,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", choices=sorted(ZOO_DQN), default="CartPole-v1")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="rlfleet --set overrides")
    ap.add_argument("--label", default="", help="a name for this setting in the JSON line")
    args = ap.parse_args()
    torch.set_num_threads(1)
    budget = int(ZOO_DQN[args.env]["n_timesteps"])
    extra = [x for s in args.sets for x in ("--set", s)]
    runs = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        runs.append(run_rlfleet(args.env, seed, args.actors, budget, extra))
        print("rlfleet", json.dumps(runs[-1]), flush=True)
    result = {"env": args.env, "target": TARGETS[args.env], "actors": args.actors, "budget_env_steps": budget,
              "label": args.label, "sets": args.sets, **summary(runs, budget)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
