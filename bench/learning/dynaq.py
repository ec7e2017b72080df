"""Parallel Dyna-Q against the same DQN without planning: real env steps to solve, same seeds, same run.

    .venv/bin/python -m bench.learning.dynaq [--env CartPole-v1] [--seeds 3] [--planners 2] [--eval-every 2500]

Both sides run configs/cartpole-dynaq.yaml through `rlfleet up` with one actor:
with planning (the modeler and ``--planners`` planners) and with
``planning.enabled=false`` (the same DQN, the same one-step transitions, the
same real table and rate limiter; the imagined table stays empty). A run is
solved at the first evaluation (10 greedy episodes every ``--eval-every`` real
env steps) whose mean return reaches the target (475 for CartPole), within the
budget (the SB3 zoo's 50k env steps for CartPole). Runs alternate (planning
seed 0, plain seed 0, planning seed 1, ...).

``real_steps_ratio`` = median real env steps to solve with planning / without,
an unsolved run counting as the budget (so a side that fails looks better than
it is: ``ratio_counts`` is false when planning solved fewer seeds than the
plain DQN). ``wall_ratio`` is the same for wall seconds (planners, the modeler
and the actor share the same cores). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from bench.learning.time_to_solve import run_rlfleet
from bench.peers.sb3_peers import TARGETS, ZOO_DQN


def within(run: dict[str, Any], budget: int) -> bool:
    """Solved within the budget (the launcher stops a little past --max-env-steps: a later solve does not count)."""
    return bool(run["solved"]) and run["env_steps"] <= budget


def summary(runs: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    steps = [r["env_steps"] if within(r, budget) else budget for r in runs]
    return {"solved": sum(within(r, budget) for r in runs), "runs": len(runs),
            "median_real_steps": statistics.median(steps),
            "median_wall_s": statistics.median(r["wall_s"] for r in runs),
            "median_updates": statistics.median(r["updates"] for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CartPole-v1", choices=["CartPole-v1", "LunarLander-v3"])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--planners", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=2500)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override (both sides)")
    args = ap.parse_args()
    budget = int(ZOO_DQN[args.env]["n_timesteps"])
    extra = [x for s in args.sets for x in ("--set", s)]
    planning, plain = [], []
    for seed in range(args.seeds):
        planning.append(run_rlfleet(args.env, seed, 1, budget, [*extra, "--planners", str(args.planners)],
                                    algo="dynaq", eval_every=args.eval_every))
        print("planning", json.dumps(planning[-1]), flush=True)
        plain.append(run_rlfleet(args.env, seed, 1, budget, [*extra, "--set", "planning.enabled=false"],
                                 algo="dynaq", eval_every=args.eval_every))
        print("plain", json.dumps(plain[-1]), flush=True)
    ours, base = summary(planning, budget), summary(plain, budget)
    result = {
        "env": args.env, "target": TARGETS[args.env], "budget": budget, "planners": args.planners,
        "seeds": args.seeds, "planning": ours, "plain": base,
        "real_steps_ratio": round(ours["median_real_steps"] / base["median_real_steps"], 3),
        "wall_ratio": round(ours["median_wall_s"] / base["median_wall_s"], 3),
        "ratio_counts": ours["solved"] >= base["solved"],
        "solved": f"{ours['solved']}/{ours['runs']} vs {base['solved']}/{base['runs']}",
        "real_steps": {"planning": [r["env_steps"] if within(r, budget) else None for r in planning],
                       "plain": [r["env_steps"] if within(r, budget) else None for r in plain]},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
