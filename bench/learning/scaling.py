"""Scaling with a slow simulator: time to target with 1, 2, 4, 8 actors when every env step waits.

    .venv/bin/python -m bench.learning.scaling [--config configs/cartpole-dqn-slowsim.yaml]
        [--actors 1,2,4,8] [--seeds 3] [--max-seconds 400] [--target 475] [--latency-ms MS] [--docs]
        [--runs DIR [--resume | --from-runs]] [--together 1]

The config is the one a user with a slow simulator is told to use (configs/*-slowsim.yaml): its
``env.step_latency_ms`` stands for what a remote simulator, game server or robot costs per step.
Each actor count runs ``--seeds`` times (seed 0, 1, ...), each a real `rlfleet up` (processes,
async protocol) until the evaluator's mean return reaches ``--target`` or the cap (``--from-runs``
re-reads runs already made, ``--resume`` runs only those missing; ``--together 1`` runs the seeds of
one actor at once: such runs wait on the simulator, and ``of_ideal_steps_per_s`` shows whether they
held each other up). Per count, the median over its runs (null if any run missed the
target; every run's figures are listed too) of: env steps/s (mean over the run), learner
updates/s, seconds and env steps to the target as the launcher saw it (``seconds_to_target``) and
when the learner published the first version that scored it (``weights_seconds_to_target``: free
of the evaluation's own duration), the actors' mean weights staleness (versions jumped per poll).
What bounds a count: ``of_ideal_steps_per_s`` (env steps/s over N x one actor's ceiling: below ~0.9
the actors waited, on the learner through the replay ratio or on CPU) and
``updates_per_s_asked`` (the updates/s the replay ratio asks at that pace).

Reference, measured in the same run: the ceiling of one actor, a bare loop stepping the same vector
env (same latency) with random actions; N actors' ideal is N times it.

Figures: ``rlfleet report`` over the runs (RUNS/report/); ``--docs`` writes the benchmark line and
the speedup chart to docs/results/scaling-CONFIG.{json,png}, which docs/results.md shows.

Last line: JSON with every count's figures, ``speedup_N`` (time to target of the fewest actors / of
N actors, null if either missed the target), ``speedup_N_weights`` (the same on publish times) and
``speedup_N_steps`` (env steps/s of N over the fewest), for N the largest count and every count
between. The machine has 2 shared cores: time to target is noisy; steps/s less so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.learning.config_digest import settings_digest
from rlfleet.cli.report import write_report
from rlfleet.cli.rundata import load_run, summarize, weights_time_to_target
from rlfleet.common import config as config_mod
from rlfleet.common.envs import make_vector_env

CONFIG = "configs/cartpole-dqn-slowsim.yaml"  # the config a user with a slow simulator is told to use


def env_ceiling(cfg_path: str, sets: list[str], seconds: float = 3.0) -> float:
    """Env steps/s of a bare loop over one actor's vector env (the config's, ``sets`` applied) with random
    actions (a Discrete action space)."""
    cfg = config_mod.load(cfg_path, sets, environ={})
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


def mean_staleness(run: Any) -> float | None:
    """Mean over the run of the actors' weights staleness (versions an actor jumped at its last sync)."""
    col = run.progress.get("actor_staleness")
    if col is None or not np.isfinite(col).any():
        return None
    return round(float(np.nanmean(col)), 2)


def median_or_none(values: list[Any]) -> float | None:
    """The median, or None when any run missed (as ``rlfleet report``'s speedup chart counts it)."""
    if not values or any(v is None for v in values):
        return None
    return round(float(np.median(values)), 2)


def launch(actors: int, seed: int, args: argparse.Namespace, runs: Path) -> subprocess.Popen[str]:
    """Start one `rlfleet up` of ``actors`` actors on ``seed``; :func:`finish` waits for it."""
    root = runs / f"actors-{actors}" / f"seed-{seed}"
    cmd = [sys.executable, "-m", "rlfleet.cli", "up", "--config", args.config, "--actors", str(actors),
           "--sync", "async", "--until-return", str(args.target), "--max-seconds", str(args.max_seconds),
           "--runs", str(root), "--set", f"seed={seed}"]
    for s in args.set:
        cmd += ["--set", s]
    print(f"# {actors} actor(s), seed {seed}: {' '.join(cmd[2:])}", flush=True)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str], actors: int, seed: int, args: argparse.Namespace, runs: Path) -> Path:
    """Wait for a run started by :func:`launch`; its run directory."""
    try:
        out, _ = proc.communicate(timeout=args.max_seconds + 180)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    tail = [line for line in out.splitlines() if "target" in line or "time is up" in line]
    print(f"#   {actors} actor(s), seed {seed}: " + (tail[-1] if tail else f"exit {proc.returncode}"), flush=True)
    dirs = sorted((runs / f"actors-{actors}" / f"seed-{seed}").glob("*/config.yaml"))
    if not dirs:
        raise SystemExit(f"no run directory for {actors} actor(s), seed {seed} under {runs}; output:\n{out[-2000:]}")
    return dirs[-1].parent


def run_dirs_of(n: int, args: argparse.Namespace, runs: Path, together: set[int]) -> list[Path]:
    """The run directories of ``n`` actors' seeds: those under ``runs`` already (``--from-runs``, or
    ``--resume``), the others run one after another, or all at once where ``n`` is in ``together``."""
    held: dict[int, Path] = {}
    if args.from_runs or args.resume:
        for seed in range(args.seeds):
            dirs = sorted((runs / f"actors-{n}" / f"seed-{seed}").glob("*/progress.csv"))
            if dirs:
                held[seed] = dirs[-1].parent
            elif args.from_runs:
                raise SystemExit(f"no run of {n} actor(s), seed {seed} under {runs}")
    todo = [seed for seed in range(args.seeds) if seed not in held]
    if n in together:
        procs = {seed: launch(n, seed, args, runs) for seed in todo}
        held |= {seed: finish(proc, n, seed, args, runs) for seed, proc in procs.items()}
    else:
        held |= {seed: finish(launch(n, seed, args, runs), n, seed, args, runs) for seed in todo}
    return [held[seed] for seed in range(args.seeds)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actors", default="1,2,4,8", help="actor counts, comma-separated")
    ap.add_argument("--seeds", type=int, default=3, help="runs per actor count (seeds 0..K-1); figures are medians")
    ap.add_argument("--max-seconds", type=float, default=400.0, help="cap on each run")
    ap.add_argument("--latency-ms", type=float, default=None,
                    help="env.step_latency_ms (default: the config's): what one env step waits")
    ap.add_argument("--target", type=float, default=475.0, help="eval mean return to reach")
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="config override")
    ap.add_argument("--runs", default=None, help="where run directories go (default: runs/scaling-<time>)")
    ap.add_argument("--docs", action="store_true", help="copy the speedup chart and summary into docs/")
    ap.add_argument("--from-runs", action="store_true", help="summarize the runs already under --runs")
    ap.add_argument("--resume", action="store_true",
                    help="re-read the runs already under --runs, run the missing ones (a benchmark over sittings)")
    ap.add_argument("--together", default="", metavar="COUNTS",
                    help="actor counts whose seeds run at once (e.g. 1: one-actor runs wait on the simulator"
                    " and barely use the CPU; their of_ideal_steps_per_s shows whether they held each other up)")
    ap.add_argument("--ceiling", type=float, default=None, help="one actor's env steps/s ceiling, if measured")
    args = ap.parse_args()
    counts = sorted({int(n) for n in args.actors.split(",")})
    together = {int(n) for n in args.together.split(",") if n.strip()}
    if args.seeds < 1:
        ap.error(f"--seeds {args.seeds}: at least 1 run per actor count")
    if any(s.split("=", 1)[0].strip() == "seed" for s in args.set):
        ap.error("--set seed=...: the benchmark sets each run's seed itself (0 .. --seeds - 1)")
    runs = Path(args.runs or f"runs/scaling-{time.strftime('%Y%m%d-%H%M%S')}")
    runs.mkdir(parents=True, exist_ok=True)

    if args.latency_ms is not None:
        args.set.append(f"env.step_latency_ms={args.latency_ms}")
    cfg = config_mod.load(args.config, args.set, environ={})
    args.latency_ms = cfg.env.step_latency_ms
    if args.latency_ms <= 0:
        ap.error(f"{args.config}: env.step_latency_ms is 0: the benchmark is about a slow simulator; give --latency-ms")
    table = cfg.replay.tables[0]
    # learner updates/s that one env step/s asks for (the replay ratio): what each count needs of the learner
    updates_per_env_step = (table.samples_per_insert or 0.0) / cfg.algorithm.batch_size
    ceiling = args.ceiling or env_ceiling(args.config, args.set)
    print(f"# one actor's env ceiling (bare vector env loop, {args.latency_ms:g} ms/step): {ceiling:.0f} steps/s")
    rows: dict[int, dict[str, Any]] = {}
    run_dirs: list[Path] = []
    for n in counts:
        per_seed = []
        for seed, run_dir in enumerate(run_dirs_of(n, args, runs, together)):
            run_dirs.append(run_dir)
            run = load_run(run_dir, require_evals=False)
            s = summarize(run, args.target)
            w = weights_time_to_target(run, args.target)
            per_seed.append({
                "seed": seed, "steps_per_s": round(s.steps_per_s, 1), "updates_per_s": round(s.updates_per_s, 1),
                "seconds_to_target": s.seconds_to_target, "env_steps_to_target": s.env_steps_to_target,
                "weights_seconds_to_target": None if w is None else w[0],
                "best_return": None if np.isnan(s.best_return) else s.best_return, "seconds": s.seconds,
                "actor_staleness": mean_staleness(run), "run": str(run_dir.relative_to(runs)),
            })
            print(f"# {n} actor(s), seed {seed}: {json.dumps(per_seed[-1])}", flush=True)
        rows[n] = {"ideal_steps_per_s": round(n * ceiling, 1), "solved": sum(r["seconds_to_target"] is not None
                                                                               for r in per_seed)}
        for key in ("steps_per_s", "updates_per_s", "seconds_to_target", "env_steps_to_target",
                    "weights_seconds_to_target", "actor_staleness"):
            rows[n][key] = median_or_none([r[key] for r in per_seed])
        # What bounds the count: below ~0.9 of the ideal the actors waited (on the learner through the
        # replay ratio, or on CPU); the updates/s the replay ratio asks at the env steps/s reached
        rows[n]["of_ideal_steps_per_s"] = round((rows[n]["steps_per_s"] or 0.0) / (n * ceiling), 2)
        rows[n]["updates_per_s_asked"] = round((rows[n]["steps_per_s"] or 0.0) * updates_per_env_step, 1)
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
    between = {f"speedup_{n}": ratio("seconds_to_target", lo, n, True) for n in counts[1:-1]}
    result = {
        "bench": "scaling", "latency_ms": args.latency_ms, "target": args.target, "max_seconds": args.max_seconds,
        "env_ceiling_steps_per_s": round(ceiling, 1), "config": args.config,
        "config_digest": settings_digest(args.config, args.set),
        "updates_per_env_step": round(updates_per_env_step, 4), "actors": {str(n): r for n, r in rows.items()},
        f"speedup_{hi}": ratio("seconds_to_target", lo, hi, True),
        f"speedup_{hi}_weights": ratio("weights_seconds_to_target", lo, hi, True),
        f"speedup_{hi}_steps": ratio("steps_per_s", lo, hi, False), **between,
        "baseline_actors": lo, "seeds": args.seeds, "sets": args.set, "together": sorted(together),
        "date": time.strftime("%Y-%m-%d"), "cores": len(os.sched_getaffinity(0)),
    }
    if args.docs and md is not None and (report_dir / "speedup.png").is_file():
        write_docs(report_dir, result)
    print(json.dumps(result))


def write_docs(report_dir: Path, result: dict[str, Any]) -> None:
    """docs/results/scaling-CONFIG.json (the benchmark line) and scaling-CONFIG.png (the report's speedup
    chart): the scaling section of docs/results.md (``bench.learning.suite``) is made from them."""
    out = Path(__file__).resolve().parents[2] / "docs" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stem = f"scaling-{Path(result['config']).stem}"
    shutil.copy(report_dir / "speedup.png", out / f"{stem}.png")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"# wrote {out / stem}.json and .png")


if __name__ == "__main__":
    main()
