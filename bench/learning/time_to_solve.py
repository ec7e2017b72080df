"""Wall time to solve an env: `rlfleet up` against Stable-Baselines3 (DQN or PPO), same machine, same run.

    .venv/bin/python -m bench.learning.time_to_solve --env CartPole-v1 [--seeds 3] [--actors 2]
    .venv/bin/python -m bench.learning.time_to_solve --env LunarLander-v3
    .venv/bin/python -m bench.learning.time_to_solve --algo ppo --env LunarLander-v3 [--sync barrier|async]
    .venv/bin/python -m bench.learning.time_to_solve --algo sac --env Pendulum-v1 [--sync async|barrier]
    .venv/bin/python -m bench.learning.time_to_solve --algo a3c --env CartPole-v1 [--workers 1,2,4]

Both sides are evaluated the same way: the mean return of 10 deterministic
(greedy, or mean-action) episodes every EVAL_EVERY env steps; the first
evaluation at or above the target counts (475 for CartPole, 200 for
LunarLander). rlfleet's time runs from launching `rlfleet up` (services
started from cold) to that evaluation; SB3's from building its envs and model
to that evaluation, evaluations included. SB3 runs the rl-baselines3-zoo
hyperparameters for the env at its best (bench/peers/sb3_peers.py), with the faster of
1 torch thread and one per core (--peer-threads; rlfleet's services take theirs from
the config). The runs
alternate (rlfleet seed 0, SB3 seed 0, rlfleet seed 1, ...).

--algo dqn (the default): every 5,000 env steps, within the zoo's step budget;
a run that never reaches the target counts as the wall time it took to spend
that budget. Also measured, each with its ceiling: env steps/s per rlfleet
actor against raw gymnasium stepping with random actions, and learner
updates/s against a plain in-process PyTorch loop of the same network and
batch size. ``ratio`` = rlfleet / SB3 median wall seconds over all runs;
``ratio_counts`` false: rlfleet solved fewer seeds than SB3 and the ratio is no claim.

--algo ppo: configs/<env>-ppo.yaml (--sync barrier = DPPO, async = APPO: configs/<env>-appo.yaml where shipped)
against SB3 PPO; evaluations every 2,000 (CartPole) or 10,000 (LunarLander)
env steps, budgets 200k and 1.5M env steps on both sides. ``ratio`` =
rlfleet / SB3 median wall seconds over the solved runs of each side (null if
a side solved none); ``ratio_counts`` is false when rlfleet solved fewer seeds than SB3 (its
ratio is then no claim), ``solved`` prints both counts; ``ratio_all`` counts an unsolved run as the wall time it
took to spend its budget (a lower bound of its time to solve).
``env_steps_per_s`` on both sides: env steps / wall seconds of a run, start-up
and evaluations included.

--algo a3c: configs/cartpole-a3c.yaml with 1, 2 and 4 gradient workers (--workers) against SB3 A2C
with the zoo's settings (bench/peers/sb3_a2c.py), evaluations every 5,000 env steps, budget the zoo's 500k
on both sides. ``ratio`` = 4 workers / SB3 median wall seconds over solved runs, ``speedup_4`` = 1
worker / 4 workers.

--algo sac: configs/pendulum-sac.yaml (or lunarlandercontinuous-sac.yaml), async by default,
against SB3 SAC with the zoo's settings (bench/peers/sb3_sac.py), evaluations every 1,000 (Pendulum,
target -200) or 10,000 (LunarLanderContinuous, target 200) env steps, budgets the zoo's
n_timesteps (20k, 500k) on both sides; ratios as for ppo.

A benchmark of hours (SAC on LunarLanderContinuous: SB3 with the zoo's 400x300 networks trains at
56-79 updates/s on 2 CPU cores, one update per env step, 500k steps of budget) can run a seed and a
side at a time: ``--first-seed S --seeds 1 [--no-sb3 | --no-rlfleet] --runs-file F`` appends each
run to F (JSON lines: the setting, seed, side and date) and summarises every run of the
same setting F holds, the latest per seed and side.

--peer sb3|sample-factory|rllib (comma-separated; default sb3), --algo ppo or dqn: the distributed peers run
beside SB3, each a subprocess of its own virtualenv (.peers/, `make peers`) running its runner script
(bench/peers/*_runner.py: Sample Factory APPO for ppo, RLlib PPO or DQN) with the same seeds, budget,
evaluation interval and greedy 10-episode evaluation on the same fixed seeds as rlfleet's evaluator
(bench/peers/greedy_eval.py), its clock from the launch of its subprocess (start-up included) to the first
evaluation at the target. The JSON line then holds a block per peer (``sample_factory``, ``rllib``) and
``ratio_<peer>`` against each one named, sb3 included (bench/learning/race.py: rlfleet's median wall over
solved runs / the peer's over all runs, an unsolved peer run counted at the wall time of its budget, how
many in ``ratio_<peer>_unsolved``).

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from bench.learning.peer_results import save_race
from bench.learning.race import block_name, race_blocks
from bench.peers.sb3_a2c import A2C_BUDGET, A2C_EVAL_EVERY, run_sb3_a2c
from bench.peers.sb3_peers import (
    DQN_EVAL_EVERY,
    EVAL_EPISODES,
    PEER_THREADS,
    PPO_BUDGET,
    PPO_EVAL_EVERY,
    TARGETS,
    ZOO_DQN,
    run_peer,
    run_sb3_dqn,
    run_sb3_ppo,
)
from bench.peers.sb3_sac import SAC_BUDGET, SAC_EVAL_EVERY, run_sb3_sac
from bench.peers.venv_peers import VENV_PEERS, PeerError, check_peer, parse_peers, run_venv_peer

ROOT = Path(__file__).resolve().parents[2]

CONFIGS = {
    ("dqn", "CartPole-v1"): "configs/cartpole-dqn.yaml", ("dqn", "LunarLander-v3"): "configs/lunarlander-dqn.yaml",
    ("ppo", "CartPole-v1"): "configs/cartpole-ppo.yaml", ("ppo", "LunarLander-v3"): "configs/lunarlander-ppo.yaml",
    ("appo", "LunarLander-v3"): "configs/lunarlander-appo.yaml",  # --algo ppo --sync async runs it
    ("sac", "Pendulum-v1"): "configs/pendulum-sac.yaml",
    ("sac", "LunarLanderContinuous-v3"): "configs/lunarlandercontinuous-sac.yaml",
    ("a3c", "CartPole-v1"): "configs/cartpole-a3c.yaml",
    ("dynaq", "CartPole-v1"): "configs/cartpole-dynaq.yaml",
}
# algo -> (env-step budgets, evaluation intervals, the SB3 peer) of the side-by-side runs with medians over solved
PAIRED: dict[str, tuple[dict[str, int], dict[str, int], Callable[[str, int, int], dict[str, Any]]]] = {
    "ppo": (PPO_BUDGET, PPO_EVAL_EVERY, run_sb3_ppo),
    "sac": (SAC_BUDGET, SAC_EVAL_EVERY, run_sb3_sac),
}


def run_rlfleet(env_id: str, seed: int, actors: int, budget: int, extra: list[str], algo: str = "dqn",
                eval_every: int = DQN_EVAL_EVERY) -> dict[str, Any]:
    """`rlfleet up` on the shipped config of ``algo`` on ``env_id`` (:data:`CONFIGS`)."""
    return run_fleet(ROOT / CONFIGS[algo, env_id], seed, actors, budget, eval_every, TARGETS[env_id], extra)


def run_fleet(config: Path, seed: int, actors: int | None, budget: int, eval_every: int, target: float | None,
              extra: list[str] | None = None, max_seconds: float | None = None) -> dict[str, Any]:
    """One `rlfleet up` of ``config`` until ``target`` (None: until the budget), its figures and its evaluation
    curve ([env steps, wall seconds from launch, mean return] per evaluation)."""
    runs = Path(tempfile.mkdtemp(prefix="tts-"))
    cmd = [
        sys.executable, "-m", "rlfleet.cli", "up", "--config", str(config), "--max-env-steps", str(budget),
        "--runs", str(runs), "--set", f"seed={seed}", "--set", f"evaluator.every_steps={eval_every}",
        "--set", f"evaluator.episodes={EVAL_EPISODES}", *(extra or []),
    ]
    cmd += ["--actors", str(actors)] if actors else []
    cmd += ["--until-return", str(target)] if target is not None else []
    cmd += ["--max-seconds", str(max_seconds)] if max_seconds else []
    start, start_epoch = time.perf_counter(), time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    solved_at = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("target reached") and solved_at is None:
            solved_at = time.perf_counter() - start
    ended = time.perf_counter() - start
    proc.wait()
    run_dir = next(d for d in runs.iterdir() if d.is_dir())
    with open(run_dir / "evaluations.csv", newline="") as f:
        evals = [r for r in csv.DictReader(f) if r["env_steps"]]
    hit = next((r for r in evals if target is not None and float(r["mean_return"]) >= target
                and int(r["env_steps"]) <= budget), None)
    if solved_at is None and hit is not None:
        # The first evaluation at or above the target counts (as SB3's callback): an evaluation of
        # weights from within the budget can finish after the launcher stopped on the budget.
        solved_at = float(hit["wall_time"]) - start_epoch
    with open(run_dir / "progress.csv", newline="") as f:
        progress = list(csv.DictReader(f))
    busy = [r for r in progress if float(r["env_steps_per_s"]) > 0]
    wall = solved_at if solved_at is not None else ended
    steps = int(hit["env_steps"]) if hit else int(float(progress[-1]["env_steps"])) if progress else 0
    return {
        "seed": seed,
        "solved": solved_at is not None,
        "wall_s": round(wall, 2),
        "env_steps": steps,
        "env_steps_per_s": statistics.median(float(r["env_steps_per_s"]) for r in busy) if busy else 0.0,
        "updates_per_s": statistics.median(float(r["updates_per_s"]) for r in busy) if busy else 0.0,
        "steps_per_wall_s": round(steps / wall, 1) if wall > 0 else 0.0,
        "updates": int(float(progress[-1]["updates"])) if progress else 0,
        **evaluation_curve(evals, start_epoch),
        "run_dir": str(run_dir),
    }


def evaluation_curve(evals: list[dict[str, str]], start_epoch: float) -> dict[str, Any]:
    """A run's ``best_return`` and ``curve`` ([env steps, wall seconds from launch, mean return] per
    evaluation) from the rows of its evaluations.csv."""
    return {"best_return": max((float(r["mean_return"]) for r in evals), default=None),
            "curve": [[int(r["env_steps"]), round(float(r["wall_time"]) - start_epoch, 2),
                       round(float(r["mean_return"]), 2)] for r in evals]}


def raw_env_steps_per_s(env_id: str, seconds: float = 3.0) -> float:
    env = gym.make(env_id, render_mode=None)
    env.reset(seed=0)
    env.action_space.seed(0)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        n += 1
        if term or trunc:
            env.reset()
    return n / (time.perf_counter() - start)


def raw_updates_per_s(env_id: str, seconds: float = 3.0) -> float:
    """A plain PyTorch DQN update loop on the same network and batch size as rlfleet's config."""
    from rlfleet.common import config as config_mod
    from rlfleet.common.algorithms.dqn.networks import build_q_network

    cfg = config_mod.load(ROOT / CONFIGS["dqn", env_id], environ={}).algorithm
    env = gym.make(env_id)
    assert env.observation_space.shape is not None and isinstance(env.action_space, gym.spaces.Discrete)
    net = build_q_network(cfg.hidden, cfg.dueling, env.observation_space, env.action_space)
    target = build_q_network(cfg.hidden, cfg.dueling, env.observation_space, env.action_space)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    b, dim = cfg.batch_size, int(np.prod(env.observation_space.shape))
    obs, nxt = torch.randn(b, dim), torch.randn(b, dim)
    act = torch.randint(0, int(env.action_space.n), (b,))
    rew, disc = torch.randn(b), torch.full((b,), 0.97)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        with torch.no_grad():
            best = net(nxt).argmax(1, keepdim=True)
            y = rew + disc * target(nxt).gather(1, best).squeeze(1)
        q = net(obs).gather(1, act[:, None]).squeeze(1)
        loss = torch.nn.functional.smooth_l1_loss(q, y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
        opt.step()
        n += 1
    return n / (time.perf_counter() - start)


def median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def dqn_main(args: argparse.Namespace) -> None:
    budget = int(ZOO_DQN[args.env]["n_timesteps"] * args.budget_factor)
    extra = [x for s in args.sets for x in ("--set", s)]
    if args.sync:
        extra += ["--sync", args.sync]
    ours, theirs = [], []
    others: dict[str, list[dict[str, Any]]] = {p: [] for p in args.peers if p in VENV_PEERS}
    for seed in range(args.seeds):
        ours.append(run_rlfleet(args.env, seed, args.actors, budget, extra))
        print("rlfleet", json.dumps(ours[-1]), flush=True)
        if "sb3" in args.peers:
            theirs.append(run_peer(run_sb3_dqn, args.peer_threads, args.env, seed))
            print("sb3", json.dumps(theirs[-1]), flush=True)
        run_venv_peers(args, others, seed, budget, DQN_EVAL_EVERY)
    raw_steps = raw_env_steps_per_s(args.env)
    raw_updates = raw_updates_per_s(args.env)
    per_actor = median(ours, "env_steps_per_s") / args.actors
    result: dict[str, Any] = {
        "algo": "dqn",
        "env": args.env,
        "target": TARGETS[args.env],
        "actors": args.actors,
        "rlfleet": {"median_wall_s": median(ours, "wall_s"), "median_env_steps": median(ours, "env_steps"),
                    "solved": sum(r["solved"] for r in ours), "runs": len(ours),
                    "env_steps_per_s": round(median(ours, "steps_per_wall_s"), 1)},
    }
    if theirs:
        result |= {
            "sb3": {"median_wall_s": median(theirs, "wall_s"), "median_env_steps": median(theirs, "env_steps"),
                    "solved": sum(r["solved"] for r in theirs), "runs": len(theirs),
                    "torch_threads": args.peer_threads,
                    "env_steps_per_s": round(statistics.median(r["env_steps"] / r["wall_s"] for r in theirs), 1)},
            "ratio": round(median(ours, "wall_s") / median(theirs, "wall_s"), 3),
            # a ratio only counts where rlfleet solved as many seeds as the peer: an unsolved run's time is
            # the time it took to spend the budget, which can make a failing side look fast
            "ratio_counts": sum(r["solved"] for r in ours) >= sum(r["solved"] for r in theirs),
            "solved": f"{sum(r['solved'] for r in ours)}/{len(ours)} vs "
                      f"{sum(r['solved'] for r in theirs)}/{len(theirs)}",
        }
    result |= peer_ratios(ours, theirs, others)
    result |= {
        "env_steps_per_s_per_actor": round(per_actor, 1),
        "raw_env_steps_per_s": round(raw_steps, 1),
        "actor_ratio": round(per_actor / raw_steps, 3),
        "learner_updates_per_s": round(median(ours, "updates_per_s"), 1),
        "raw_updates_per_s": round(raw_updates, 1),
        "learner_ratio": round(median(ours, "updates_per_s") / raw_updates, 3),
    }
    print(json.dumps(result))
    if args.docs:
        save_race(args.docs, "bench.learning.time_to_solve", result)


def run_venv_peers(args: argparse.Namespace, others: dict[str, list[dict[str, Any]]], seed: int, budget: int,
                   eval_every: int, key: dict[str, Any] | None = None) -> None:
    """One run of each peer of ``others`` (a venv peer) on ``seed``, appended to its list and recorded."""
    for peer, runs in others.items():
        runs.append(run_venv_peer(peer, args.algo, args.env, seed, budget, eval_every, TARGETS[args.env],
                                  timeout_s=args.peer_timeout))
        print(peer, json.dumps(runs[-1]), flush=True)
        if key is not None:
            record(args.runs_file, peer_setting(key), peer, seed, runs[-1])


def peer_ratios(ours: list[dict[str, Any]], sb3: list[dict[str, Any]],
                others: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The venv peers' blocks and ``ratio_<peer>`` against each peer that ran, sb3 included (its block is
    the one the caller already made)."""
    blocks = race_blocks(ours, ({"sb3": sb3} if sb3 else {}) | {p: r for p, r in others.items() if r})
    blocks.pop("rlfleet")
    blocks.pop("sb3", None)
    return blocks


def side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's summary: medians over its solved runs (all runs where it solved none)."""
    solved = [r for r in runs if r["solved"]]
    over = solved or runs
    threads = {"torch_threads": runs[0]["torch_threads"]} if "torch_threads" in runs[0] else {}
    return {**threads, "solved": len(solved), "runs": len(runs), "median_wall_s": median(over, "wall_s"),
            "median_env_steps": median(over, "env_steps"),
            "env_steps_per_s": round(median(runs, "steps_per_wall_s"), 1),
            "wall_s": [r["wall_s"] for r in runs], "env_steps": [r["env_steps"] for r in runs],
            "solved_by_seed": [r["solved"] for r in runs]}


def record(path: str | None, key: dict[str, Any], who: str, seed: int, run: dict[str, Any]) -> None:
    """Append one run to ``path`` (JSON lines) with what makes it comparable and when it ended."""
    if path:  # the run's directory is a temporary path of this machine: not kept
        kept = {k: v for k, v in run.items() if k != "run_dir"}
        line = {**key, "side": who, "seed": seed, "date": time.strftime("%Y-%m-%d %H:%M"), "run": kept}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


def recorded(path: str, key: dict[str, Any], who: str, threads: int | None = None) -> list[dict[str, Any]]:
    """The runs of ``who`` with setting ``key`` in ``path``, the latest per seed, in seed order (only those
    run with ``threads`` torch threads, when given: a peer's runs with another count are not pooled; runs
    recorded before the count was kept had one)."""
    latest: dict[int, dict[str, Any]] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                entry = json.loads(line)
                if (entry.get("side") == who and all(entry.get(k) == v for k, v in key.items())
                        and (threads is None or entry["run"].get("torch_threads", 1) == threads)):
                    latest[int(entry["seed"])] = entry["run"]
    return [latest[s] for s in sorted(latest)]


def peer_setting(key: dict[str, Any]) -> dict[str, Any]:
    """What makes the peer's runs comparable: not rlfleet's protocol or --set overrides."""
    return {k: v for k, v in key.items() if k not in ("sync", "sets")}


def paired_main(args: argparse.Namespace) -> None:
    """PPO or SAC against its SB3 peer: same budget, same evaluations, medians over solved runs."""
    budgets, evals, peer = PAIRED[args.algo]
    if (args.algo, args.env) not in CONFIGS:
        raise SystemExit(f"--algo {args.algo} runs on {', '.join(e for a, e in CONFIGS if a == args.algo)}")
    budget = int(budgets[args.env] * args.budget_factor)
    sync = args.sync or ("barrier" if args.algo == "ppo" else "async")
    extra = ["--sync", sync, *[x for s in args.sets for x in ("--set", s)]]
    # APPO has its own config where one is shipped (its pacing and learn calls differ from DPPO's)
    config_of = "appo" if args.algo == "ppo" and sync == "async" and ("appo", args.env) in CONFIGS else args.algo
    ours, theirs = [], []
    others: dict[str, list[dict[str, Any]]] = {p: [] for p in args.peers if p in VENV_PEERS}
    key = {"algo": args.algo, "env": args.env, "sync": sync, "budget": budget, "sets": args.sets}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        if not args.no_rlfleet:
            ours.append(run_rlfleet(args.env, seed, args.actors, budget, extra, config_of, evals[args.env]))
            print("rlfleet", json.dumps(ours[-1]), flush=True)
            record(args.runs_file, key, "rlfleet", seed, ours[-1])
        if not args.no_sb3 and "sb3" in args.peers:
            theirs.append(run_peer(peer, args.peer_threads, args.env, seed, budget))
            theirs[-1]["steps_per_wall_s"] = theirs[-1]["env_steps_per_s"]
            print("sb3", json.dumps(theirs[-1]), flush=True)
            record(args.runs_file, key, "sb3", seed, theirs[-1])
        run_venv_peers(args, others, seed, budget, evals[args.env], key)
    if args.runs_file:  # the summary pools every run of this setting the file holds (the latest per seed)
        ours = recorded(args.runs_file, key, "rlfleet")
        theirs = recorded(args.runs_file, peer_setting(key), "sb3", threads=args.peer_threads)
        others = {p: recorded(args.runs_file, peer_setting(key), p) for p in others}
    if not ours:
        print(json.dumps({"algo": args.algo, "env": args.env, "sb3": side(theirs) if theirs else None}
                         | {block_name(p): side(r) for p, r in others.items() if r}))
        return
    ours_solved = [r for r in ours if r["solved"]]
    theirs_solved = [r for r in theirs if r["solved"]]
    rl = side(ours)
    rl["actor_env_steps_per_s"] = round(median(ours, "env_steps_per_s"), 1)  # progress.csv, while stepping
    # Gradient steps (minibatches) over the whole run: the learner idles while barrier actors act.
    rl["learner_updates_per_wall_s"] = round(statistics.median(r["updates"] / r["wall_s"] for r in ours), 1)
    result: dict[str, Any] = {
        "algo": args.algo, "env": args.env, "sync": sync, "target": TARGETS[args.env], "actors": args.actors,
        "budget_env_steps": budget, "eval_every": evals[args.env],
        "ratio": (round(median(ours_solved, "wall_s") / median(theirs_solved, "wall_s"), 3)
                  if ours_solved and theirs_solved else None),
        "ratio_all": round(median(ours, "wall_s") / median(theirs, "wall_s"), 3) if theirs else None,
        "ratio_counts": len(ours_solved) >= len(theirs_solved) if theirs else None,
        "solved": f"{len(ours_solved)}/{len(ours)} vs {len(theirs_solved)}/{len(theirs)}" if theirs else None,
        "rlfleet": rl, "sb3": side(theirs) if theirs else None,
        "raw_env_steps_per_s": round(raw_env_steps_per_s(args.env), 1),
        **peer_ratios(ours, theirs, others),
    }
    print(json.dumps(result))
    if args.docs:
        save_race(args.docs, "bench.learning.time_to_solve", result)


def a3c_main(args: argparse.Namespace) -> None:
    """A3C with 1, 2 and 4 gradient workers against SB3 A2C: the same seeds, alternating runs."""
    if (args.algo, args.env) not in CONFIGS:
        raise SystemExit(f"--algo a3c runs on {', '.join(e for a, e in CONFIGS if a == 'a3c')}")
    budget = int(A2C_BUDGET[args.env] * args.budget_factor)
    extra = [x for s in args.sets for x in ("--set", s)]
    workers = [int(w) for w in args.workers.split(",")]
    ours: dict[int, list[dict[str, Any]]] = {w: [] for w in workers}
    theirs: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        for w in workers:
            ours[w].append(run_rlfleet(args.env, seed, w, budget, extra, "a3c", A2C_EVAL_EVERY[args.env]))
            print(f"rlfleet workers={w}", json.dumps(ours[w][-1]), flush=True)
        if not args.no_sb3:
            theirs.append(run_peer(run_sb3_a2c, args.peer_threads, args.env, seed, budget))
            theirs[-1]["steps_per_wall_s"] = theirs[-1]["env_steps_per_s"]
            print("sb3", json.dumps(theirs[-1]), flush=True)

    def solved_median(runs: list[dict[str, Any]]) -> float | None:
        solved = [r for r in runs if r["solved"]]
        return median(solved, "wall_s") if solved else None

    most = max(workers)
    ours_most, peer = solved_median(ours[most]), solved_median(theirs)
    one = solved_median(ours[min(workers)])
    result: dict[str, Any] = {
        "algo": "a3c", "env": args.env, "target": TARGETS[args.env], "budget_env_steps": budget,
        "eval_every": A2C_EVAL_EVERY[args.env], "workers": workers,
        # the goal's figures: the most workers against SB3 A2C, and against 1 worker (medians of solved runs)
        "ratio": round(ours_most / peer, 3) if ours_most and peer else None,
        f"speedup_{most}": round(one / ours_most, 3) if one and ours_most else None,
        "ratio_counts": sum(r["solved"] for r in ours[most]) >= sum(r["solved"] for r in theirs) if theirs else None,
        "solved": {f"rlfleet_{w}": f"{sum(r['solved'] for r in ours[w])}/{len(ours[w])}" for w in workers}
        | ({"sb3": f"{sum(r['solved'] for r in theirs)}/{len(theirs)}"} if theirs else {}),
        "rlfleet": {w: side(ours[w]) for w in workers}, "sb3": side(theirs) if theirs else None,
    }
    print(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algo", choices=["dqn", "ppo", "sac", "a3c"], default="dqn")
    ap.add_argument("--env", choices=sorted(TARGETS), default="CartPole-v1")
    ap.add_argument("--sync", choices=["barrier", "async"], default=None,
                    help="rlfleet's training protocol (default: the config's; ppo: barrier)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--budget-factor", type=float, default=1.0,
                    help="the env-step budget as a multiple of the default (dqn: the zoo's, rlfleet only; "
                         "ppo: 200k CartPole, 1.5M LunarLander, both sides)")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra rlfleet --set overrides")
    ap.add_argument("--no-sb3", action="store_true", help="ppo, sac, a3c: rlfleet only (no peer, no ratio)")
    ap.add_argument("--no-rlfleet", action="store_true", help="ppo, sac: the SB3 peer only")
    ap.add_argument("--first-seed", type=int, default=0, help="ppo, sac: seeds first-seed .. first-seed+seeds-1")
    ap.add_argument("--runs-file", default=None,
                    help="ppo, sac: append every run to this JSON-lines file and summarise all of its runs of the "
                         "same setting (the latest per seed and side): a benchmark of hours, run a seed at a time")
    ap.add_argument("--peer-threads", type=int, default=None,
                    help="torch threads of the SB3 peer (default: its faster count here, bench/peers/sb3_peers.py)")
    ap.add_argument("--workers", default="1,2,4", help="a3c: gradient worker counts to run (each on every seed)")
    ap.add_argument("--peer", default="sb3",
                    help="the peers to race, comma-separated: sb3 (in process), sample-factory (ppo), rllib (ppo, "
                         "dqn); the last two from their venvs under .peers/ (make peers)")
    ap.add_argument("--docs", default=None, metavar="NAME",
                    help="keep the JSON line as docs/results/peers-NAME.json for the results page "
                         "(bench.learning.suite)")
    ap.add_argument("--peer-timeout", type=float, default=4 * 3600.0,
                    help="seconds a venv peer's run may take before the benchmark gives up on it")
    args = ap.parse_args()
    try:
        args.peers = parse_peers(args.peer)
        for name in args.peers:
            if name in VENV_PEERS:
                check_peer(name, args.algo)
    except (ValueError, PeerError) as exc:
        ap.error(str(exc))
    args.peer_threads = args.peer_threads or PEER_THREADS[args.algo]
    torch.set_num_threads(1)
    if args.algo == "a3c":
        a3c_main(args)
    elif args.algo in PAIRED:
        paired_main(args)
    else:
        dqn_main(args)


if __name__ == "__main__":
    main()
