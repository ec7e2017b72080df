"""Does the Python API add to the time to solve? cartpole-dqn to 475 through `rlfleet.train` and
through `rlfleet up`, alternating (CLI seed 0, API seed 0, CLI seed 1, ...), same seeds and budget.

    .venv/bin/python -m bench.learning.api_overhead [--seeds 5] [--budget 50000]

Each run is a fresh interpreter (the API side: `python -c "import rlfleet; rlfleet.train(...)"`), so
both sides pay the same start-up. Per run: ``process_s``, launch to exit; ``to_end_s``, the run's
own clock (ending.json's wall_s: from the fleet healthy to the target or the budget); whether it
solved. ``ratio_process`` and ``ratio_run`` = API / CLI median over all runs of each side.
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
    return {"side": side, "seed": seed, "solved": ending["how"] == "target", "process_s": round(process_s, 2),
            "to_end_s": round(ending["wall_s"], 2), "env_steps": ending["env_steps"], "run_dir": str(dirs[0])}


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
    summary["ratio_process"] = round(summary["process_s"]["api"] / summary["process_s"]["cli"], 3)
    summary["ratio_run"] = round(summary["to_end_s"]["api"] / max(1e-9, summary["to_end_s"]["cli"]), 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
