"""Scaling with a slow simulator: 1, 2, 4, 8 actors on CartPole with 2 ms per env step.

    .venv/bin/python -m bench.learning.scaling [--actors 1,2,4,8] [--seeds 3] [--max-seconds 400] [--docs]

Each count runs ``--seeds`` times (seed 0, 1, ...), each a real `rlfleet up`
(processes, async protocol, the experiment file plus ``env.step_latency_ms``:
what a remote simulator, game server or robot costs, and BENCH_SETS) until the
evaluator's mean return reaches the target or the cap (``--from-runs`` re-reads
runs already made). Per count, the median over its runs (null if any run missed
the target; every run's figures are listed too) of:
env steps/s (mean over the run), learner updates/s, seconds and env steps to
the target as the launcher saw it (``seconds_to_target``) and
when the learner published the first version that scored it
(``weights_seconds_to_target``: free of the evaluation's own duration).

Reference, measured in the same run: the ceiling of one actor, a bare loop
stepping the same vector env (same latency) with random actions; N actors'
ideal is N times it.

Figures: ``rlfleet report`` over the runs (RUNS/report/); ``--docs`` copies
its speedup chart to docs/scaling.png and its tables with the JSON to
docs/scaling.md.

Last line: JSON with every count's figures, ``speedup_8`` (time to target of
1 actor / of 8, null if either missed the target), ``speedup_8_weights`` (the
same on publish times) and ``speedup_8_steps`` (env steps/s of 8 / of 1).
The machine has 2 shared cores: time to target is noisy; steps/s less so.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from cli.report import write_report
from cli.rundata import load_run, summarize, weights_time_to_target
from common import config as config_mod
from common.envs import make_vector_env

CONFIG = "configs/cartpole-dqn.yaml"
# The learner must keep up with 8 latency-bound actors on 2 cores (~3,700 env steps/s at
# 2 ms): at 32 samples per insert (the experiment's until it took 128) and batch 256 that is ~460 updates/s, and
# it makes ~240-330 next to them, so the fleet waits on it (speedup_8 2.4-4.8). At 16 samples
# per insert 8 actors need ~230: the run is bound by the simulator, as the question asks; one
# actor then needs more env steps to the target (~51k against ~26k at 32). Actors poll for
# weights every 10 vector steps instead of 50: with 8 actors the learner moves ~8x as far
# between an actor's polls. Every actor explores with epsilon 0.1, as one actor does (Ape-X's
# spread, 0.1 down to 0.1^4 here, changes the behaviour with the count: 8 actors then needed a
# median 73k env steps, against 64k with the same epsilon for all).
# The evaluator's 10 episodes step at once, a thread each: one after another, a solved
# evaluation (10 x 500 steps at 2 ms) would add 10 s to every time to target; a process
# each (async) costs about twice the CPU, taken from the learner.
BENCH_SETS = ["algorithm.batch_size=256", "replay.tables.0.samples_per_insert=16", "actor.poll_every=10",
              "algorithm.epsilon_alpha=0", "evaluator.vectorization=threads"]


def env_ceiling(cfg_path: str, latency_ms: float, sets: list[str], seconds: float = 3.0) -> float:
    """Env steps/s of a bare loop over one actor's vector env with random actions (a Discrete action space)."""
    cfg = config_mod.load(cfg_path, [*sets, f"env.step_latency_ms={latency_ms}"], environ={})
    envs = make_vector_env(cfg.env, 0)
    rng = np.random.default_rng(0)
    actions = int(envs.single_action_space.n)  # type: ignore[attr-defined]
    try:
        envs.reset(seed=0)
        steps, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            envs.step(rng.integers(0, actions, cfg.env.num_envs))
            steps += cfg.env.num_envs
        return steps / (time.monotonic() - start)
    finally:
        envs.close()


def median_or_none(values: list[Any]) -> float | None:
    """The median, or None when any run missed (as ``rlfleet report``'s speedup chart counts it)."""
    if not values or any(v is None for v in values):
        return None
    return round(float(np.median(values)), 2)


def run_one(actors: int, seed: int, args: argparse.Namespace, runs: Path) -> Path:
    root = runs / f"actors-{actors}" / f"seed-{seed}"
    cmd = [sys.executable, "-m", "cli", "up", "--config", args.config, "--actors", str(actors),
           "--sync", "async", "--until-return", str(args.target), "--max-seconds", str(args.max_seconds),
           "--runs", str(root), "--set", f"env.step_latency_ms={args.latency_ms}", "--set", f"seed={seed}"]
    for s in args.set:
        cmd += ["--set", s]
    print(f"# {actors} actor(s), seed {seed}: {' '.join(cmd[2:])}", flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=args.max_seconds + 180)
    tail = [line for line in proc.stdout.splitlines() if "target" in line or "time is up" in line]
    print("#   " + (tail[-1] if tail else f"exit {proc.returncode}"), flush=True)
    dirs = sorted(root.glob("*/config.yaml"))
    if not dirs:
        raise SystemExit(f"no run directory under {root}; output:\n{proc.stdout[-2000:]}")
    return dirs[-1].parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actors", default="1,2,4,8", help="actor counts, comma-separated")
    ap.add_argument("--seeds", type=int, default=3, help="runs per actor count (seeds 0..K-1); figures are medians")
    ap.add_argument("--max-seconds", type=float, default=400.0, help="cap on each run")
    ap.add_argument("--latency-ms", type=float, default=2.0, help="env.step_latency_ms")
    ap.add_argument("--target", type=float, default=475.0, help="eval mean return to reach")
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--set", action="append", default=list(BENCH_SETS), metavar="FIELD=VALUE",
                    help=f"config override (default: {' '.join(BENCH_SETS)}; given ones are added to it)")
    ap.add_argument("--runs", default=None, help="where run directories go (default: runs/scaling-<time>)")
    ap.add_argument("--docs", action="store_true", help="copy the speedup chart and summary into docs/")
    ap.add_argument("--from-runs", action="store_true", help="summarize the runs already under --runs")
    ap.add_argument("--ceiling", type=float, default=None, help="one actor's env steps/s ceiling, if measured")
    args = ap.parse_args()
    counts = sorted({int(n) for n in args.actors.split(",")})
    if args.seeds < 1:
        ap.error(f"--seeds {args.seeds}: at least 1 run per actor count")
    if any(s.split("=", 1)[0].strip() == "seed" for s in args.set):
        ap.error("--set seed=...: the benchmark sets each run's seed itself (0 .. --seeds - 1)")
    runs = Path(args.runs or f"runs/scaling-{time.strftime('%Y%m%d-%H%M%S')}")
    runs.mkdir(parents=True, exist_ok=True)

    ceiling = args.ceiling or env_ceiling(args.config, args.latency_ms, args.set)
    print(f"# one actor's env ceiling (bare vector env loop, {args.latency_ms:g} ms/step): {ceiling:.0f} steps/s")
    rows: dict[int, dict[str, Any]] = {}
    run_dirs = []
    for n in counts:
        per_seed = []
        for seed in range(args.seeds):
            if args.from_runs:  # re-read finished runs: no new run
                found = sorted((runs / f"actors-{n}" / f"seed-{seed}").glob("*/config.yaml"))
                if not found:
                    raise SystemExit(f"no run of {n} actor(s), seed {seed} under {runs}")
                run_dir = found[-1].parent
            else:
                run_dir = run_one(n, seed, args, runs)
            run_dirs.append(run_dir)
            run = load_run(run_dir, require_evals=False)
            s = summarize(run, args.target)
            w = weights_time_to_target(run, args.target)
            per_seed.append({
                "seed": seed, "steps_per_s": round(s.steps_per_s, 1), "updates_per_s": round(s.updates_per_s, 1),
                "seconds_to_target": s.seconds_to_target, "env_steps_to_target": s.env_steps_to_target,
                "weights_seconds_to_target": None if w is None else w[0],
                "best_return": None if np.isnan(s.best_return) else s.best_return, "seconds": s.seconds,
                "run": str(run_dir),
            })
            print(f"# {n} actor(s), seed {seed}: {json.dumps(per_seed[-1])}", flush=True)
        rows[n] = {"ideal_steps_per_s": round(n * ceiling, 1), "solved": sum(r["seconds_to_target"] is not None
                                                                               for r in per_seed)}
        for key in ("steps_per_s", "updates_per_s", "seconds_to_target", "env_steps_to_target",
                    "weights_seconds_to_target"):
            rows[n][key] = median_or_none([r[key] for r in per_seed])
        rows[n]["runs"] = per_seed

    report_dir = runs / "report"
    md: Path | None = None
    try:
        md = write_report(run_dirs, report_dir, args.target)
        print(f"# report: {md}")
    except ValueError as exc:  # a run without evaluations: no report, the JSON still stands
        print(f"# no report: {exc}")

    def ratio(key: str, lo: int, hi: int, inverse: bool) -> float | None:
        a, b = rows.get(lo, {}).get(key), rows.get(hi, {}).get(key)
        if not a or not b:
            return None
        return round(a / b if inverse else b / a, 2)

    lo, hi = counts[0], counts[-1]
    result = {
        "bench": "scaling", "latency_ms": args.latency_ms, "target": args.target, "max_seconds": args.max_seconds,
        "env_ceiling_steps_per_s": round(ceiling, 1), "actors": {str(n): r for n, r in rows.items()},
        f"speedup_{hi}": ratio("seconds_to_target", lo, hi, True),
        f"speedup_{hi}_weights": ratio("weights_seconds_to_target", lo, hi, True),
        f"speedup_{hi}_steps": ratio("steps_per_s", lo, hi, False),
        "baseline_actors": lo, "seeds": args.seeds,
    }
    if args.docs and md is not None and (report_dir / "speedup.png").is_file():
        write_docs(md, report_dir, result, args)
    print(json.dumps(result))


def write_docs(md: Path, report_dir: Path, result: dict[str, Any], args: argparse.Namespace) -> None:
    """docs/scaling.png (the report's speedup chart) and docs/scaling.md (its tables and the JSON)."""
    docs = Path("docs")
    docs.mkdir(exist_ok=True)
    shutil.copy(report_dir / "speedup.png", docs / "scaling.png")
    tables = md.read_text().split("## Figures")[0].replace("# rlfleet report", "").strip()
    extra = " ".join(f"--set {s}" for s in args.set)
    (docs / "scaling.md").write_text(
        "# Scaling with a slow simulator\n\n"
        f"`.venv/bin/python -m bench.learning.scaling --docs` ({args.config}, env.step_latency_ms={args.latency_ms:g}, "
        f"async, {extra}, each run capped at {args.max_seconds:g} s), on 2 cores shared with other work: "
        "time to target is noisy, env steps/s less so.\n\n"
        "![speedup](scaling.png)\n\n" + tables + "\n\nBenchmark line:\n\n```json\n" + json.dumps(result)
        + "\n```\n"
    )


if __name__ == "__main__":
    main()
