"""Does the Python API add to the time to solve? cartpole-dqn to 475 through `rlfleet.train` and
through `rlfleet up`, alternating (CLI seed 0, API seed 0, CLI seed 1, ...), same seeds and budget.

    .venv/bin/python -m bench.learning.api_overhead [--seeds 5] [--budget 50000]

Each run is a fresh interpreter (the API side: `python -c "import rlfleet; rlfleet.train(...)"`), so
both sides pay the same start-up. Per run: ``process_s``, launch to exit; ``to_end_s``, the run's
own clock (ending.json's wall_s: from the command's start to the target or the budget); ``ready_s``,
from the command's start to every member healthy (run.json); ``steps_per_s``, env steps over the
seconds after ready; ``outside_s``, process seconds outside the run's clock (interpreter start and
exit); whether it solved and in how many env steps.

What the API could add is start-up (``ready_s``, ``outside_s``) and pace (``steps_per_s``): their
API / CLI ratios of medians are the measure. Time to solve also carries the env steps each run
needed, which differ between runs of one seed (an asynchronous fleet's order of updates and inserts
is not repeatable), so ``ratio_process`` and ``ratio_run`` need many seeds to mean anything.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cartpole-dqn.yaml"
TARGET, EVAL_EVERY, EVAL_EPISODES = 475.0, 5000, 10

API_SCRIPT = """
import sys, rlfleet
config, seed, budget, runs, target, every, episodes = sys.argv[1:8]
rlfleet.train(config, {"seed": int(seed), "evaluator.every_steps": int(every), "evaluator.episodes": int(episodes)},
              until_return=float(target), max_env_steps=int(budget), runs=runs, progress=False)
"""


def command(side: str, seed: int, budget: int, runs: Path) -> list[str]:
    if side == "api":
        return [sys.executable, "-c", API_SCRIPT, str(CONFIG), str(seed), str(budget), str(runs), str(TARGET),
                str(EVAL_EVERY), str(EVAL_EPISODES)]
    return [sys.executable, "-m", "rlfleet.cli", "up", "--config", str(CONFIG), "--set", f"seed={seed}",
            "--set", f"evaluator.every_steps={EVAL_EVERY}", "--set", f"evaluator.episodes={EVAL_EPISODES}",
            "--until-return", str(TARGET), "--max-env-steps", str(budget), "--runs", str(runs)]


def run_once(side: str, seed: int, budget: int) -> dict[str, Any]:
    runs = Path(tempfile.mkdtemp(prefix=f"api-overhead-{side}-"))
    start = time.perf_counter()
    proc = subprocess.run(command(side, seed, budget, runs), cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    process_s = time.perf_counter() - start
    dirs = [d for d in runs.iterdir() if (d / "ending.json").is_file()]
    if len(dirs) != 1:
        raise RuntimeError(f"{side} seed {seed}: exit {proc.returncode}, no run ending in {runs}:\n"
                           f"{proc.stderr[-2000:]}")
    ending = json.loads((dirs[0] / "ending.json").read_text())
    ready_s = float(json.loads((dirs[0] / "run.json").read_text())["ready_s"])
    wall_s = float(ending["wall_s"])
    return {"side": side, "seed": seed, "solved": ending["how"] == "target", "process_s": round(process_s, 2),
            "to_end_s": round(wall_s, 2), "ready_s": round(ready_s, 3),
            "outside_s": round(process_s - wall_s, 2),
            "steps_per_s": round(ending["env_steps"] / max(1e-9, wall_s - ready_s), 1),
            "env_steps": ending["env_steps"], "run_dir": str(dirs[0])}


def median_of(rows: list[dict[str, Any]], side: str, key: str) -> float:
    return statistics.median(r[key] for r in rows if r["side"] == side)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=50_000, help="env steps per run")
    args = ap.parse_args()
    rows = []
    for seed in range(args.seeds):
        for side in ("cli", "api"):
            row = run_once(side, seed, args.budget)
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = {
        "bench": "api_overhead", "config": "configs/cartpole-dqn.yaml", "seeds": args.seeds, "budget": args.budget,
        "solved": {side: sum(r["solved"] for r in rows if r["side"] == side) for side in ("cli", "api")},
        "process_s": {side: median_of(rows, side, "process_s") for side in ("cli", "api")},
        "to_end_s": {side: median_of(rows, side, "to_end_s") for side in ("cli", "api")},
    }
    for key in ("ready_s", "outside_s", "steps_per_s", "env_steps"):
        summary[key] = {side: median_of(rows, side, key) for side in ("cli", "api")}
    for name, key in (("ratio_ready", "ready_s"), ("ratio_outside", "outside_s"), ("ratio_pace", "steps_per_s")):
        summary[name] = round(summary[key]["api"] / max(1e-9, summary[key]["cli"]), 3)
    summary["ratio_process"] = round(summary["process_s"]["api"] / summary["process_s"]["cli"], 3)
    summary["ratio_run"] = round(summary["to_end_s"]["api"] / max(1e-9, summary["to_end_s"]["cli"]), 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
