"""The fastest LunarLander APPO could solve on this machine, from the CPU its work costs, beside SB3 PPO.

    .venv/bin/python -m bench.learning.appo_floor [--config configs/lunarlander-appo.yaml] [--env-steps 65536]

Issue 38 asks APPO for a median wall time to solve of at most 0.3 of SB3 PPO's (zoo settings). This
bench says whether two cores allow that at all, whatever the fleet does:

- **APPO's work per env step**, measured on the config's own objects (cli/serial.py's SerialRunner: the
  actors' policies and adders, the queue table, the PPO learner at ``learner.torch_threads``), one
  process, timed apart: acting (policy forward, env step, adder) and learning (the learn calls).
  Every env step of a fleet run costs at least both, once. On ``C`` cores, with acting and learning
  overlapped perfectly and nothing else running (no sockets, no evaluator, no start-up), a run cannot
  go faster than ``C / (act + learn)`` env steps/s.
- **SB3 PPO's wall per env step** with the zoo's settings, measured in the same run (its ``learn``
  over the same number of env steps, evaluations excluded).

The floor of the ratio is then (APPO's median env steps to solve x its seconds per env step at the
floor) / (SB3's median env steps to solve x its seconds per env step), the medians taken from the
suite's runs file (docs/results/runs.jsonl, rows lunarlander-appo and its SB3 peer). A floor above 0.3
says the goal needs more cores than this machine has, not a better fleet. Start-up and evaluations
are left out of both sides (they would raise APPO's floor: the floor is generous to the goal).

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from bench.learning.suite import ROWS, load_runs, side_key
from bench.peers.sb3_peers import PEER_THREADS, ppo_kwargs
from rlfleet.cli.serial import SerialRunner
from rlfleet.common.config import load

ROOT = Path(__file__).resolve().parents[2]


def appo_costs(config: Path, env_steps: int) -> dict[str, float]:
    """Seconds per env step of acting and of learning, the config's objects in one process, after a warm-up
    of one learn call."""
    cfg = load(config, environ={})
    runner = SerialRunner(cfg)
    act_s = learn_s = 0.0
    steps_timed = 0
    try:
        warm = runner.learner.data.batch_items * cfg.algorithm.segment_length
        while runner.env_steps < warm + env_steps:
            timing = runner.env_steps >= warm
            t0 = time.perf_counter()
            before = runner.env_steps
            runner.act()
            t1 = time.perf_counter()
            runner.learn_async()
            t2 = time.perf_counter()
            if timing:
                act_s += t1 - t0
                learn_s += t2 - t1
                steps_timed += runner.env_steps - before
    finally:
        runner.close()
    return {"act_s_per_step": act_s / steps_timed, "learn_s_per_step": learn_s / steps_timed,
            "env_steps_timed": steps_timed, "torch_threads": cfg.learner.torch_threads}


def sb3_cost(env_id: str, env_steps: int) -> float:
    """SB3 PPO's wall seconds per env step with the zoo's settings (rollouts and updates, no evaluations),
    after one warm-up rollout and update."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(PEER_THREADS["ppo"])
    n_envs, hp = ppo_kwargs(env_id, env_steps)
    env = make_vec_env(env_id, n_envs=n_envs, seed=0, env_kwargs={"render_mode": None})
    model = PPO("MlpPolicy", env, seed=0, device="cpu", verbose=0, **hp)
    rollout = n_envs * int(hp.get("n_steps", 2048))
    model.learn(total_timesteps=rollout)
    t0 = time.perf_counter()
    model.learn(total_timesteps=env_steps, reset_num_timesteps=False)
    wall = time.perf_counter() - t0
    steps = model.num_timesteps - rollout
    env.close()
    return wall / steps


def median_env_steps(row_name: str, side: str, runs_file: Path) -> tuple[float, int, int]:
    """Median env steps to solve over the solved runs of seeds 0-4, solved count, runs."""
    row = ROWS[row_name]
    runs = load_runs(runs_file)
    entries = [runs[side_key(row, side), s] for s in range(5) if (side_key(row, side), s) in runs]
    solved = [e["run"]["env_steps"] for e in entries if e["run"]["solved"]]
    return (statistics.median(solved) if solved else float("nan")), len(solved), len(entries)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "lunarlander-appo.yaml")
    ap.add_argument("--env-steps", type=int, default=65_536, help="env steps timed on each side")
    ap.add_argument("--runs-file", type=Path, default=ROOT / "docs" / "results" / "runs.jsonl")
    ap.add_argument("--goal", type=float, default=0.3, help="the wall ratio asked of APPO over SB3")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    appo = appo_costs(args.config, args.env_steps)
    sb3_s = sb3_cost("LunarLander-v3", args.env_steps)
    appo_steps, appo_solved, appo_runs = median_env_steps("lunarlander-appo", "fleet", args.runs_file)
    sb3_steps, sb3_solved, sb3_runs = median_env_steps("lunarlander-appo", "sb3", args.runs_file)
    per_step = appo["act_s_per_step"] + appo["learn_s_per_step"]
    floor_steps_per_s = cores / per_step
    appo_floor_s = appo_steps / floor_steps_per_s
    sb3_s_to_solve = sb3_steps * sb3_s
    ratio_floor = appo_floor_s / sb3_s_to_solve
    print(f"APPO: act {appo['act_s_per_step'] * 1e6:.1f} us + learn {appo['learn_s_per_step'] * 1e6:.1f} us per env "
          f"step -> at most {floor_steps_per_s:,.0f} env steps/s on {cores} cores; {appo_steps:,.0f} env steps "
          f"(median, {appo_solved}/{appo_runs}) -> {appo_floor_s:.1f} s")
    print(f"SB3 PPO: {1 / sb3_s:,.0f} env steps/s; {sb3_steps:,.0f} env steps (median, {sb3_solved}/{sb3_runs}) "
          f"-> {sb3_s_to_solve:.1f} s")
    print(f"floor of the wall ratio: {ratio_floor:.2f} (goal {args.goal})")
    print(json.dumps({
        "config": str(args.config.relative_to(ROOT)) if args.config.is_relative_to(ROOT) else str(args.config),
        "cores": cores, "env_steps_timed": args.env_steps, **{k: round(v, 9) if isinstance(v, float) else v
                                                              for k, v in appo.items()},
        "appo_floor_env_steps_per_s": round(floor_steps_per_s, 1), "appo_median_env_steps": appo_steps,
        "appo_floor_s_to_solve": round(appo_floor_s, 2), "sb3_env_steps_per_s": round(1 / sb3_s, 1),
        "sb3_median_env_steps": sb3_steps, "sb3_s_to_solve_no_evals": round(sb3_s_to_solve, 2),
        "ratio_floor": round(ratio_floor, 3), "goal": args.goal, "goal_reachable": ratio_floor <= args.goal,
    }))


if __name__ == "__main__":
    main()
