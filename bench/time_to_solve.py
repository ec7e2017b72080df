"""Wall time to solve an env: `rlfleet up` against Stable-Baselines3 DQN, same machine, same run.

    .venv/bin/python -m bench.time_to_solve --env CartPole-v1 [--seeds 3] [--actors 2]
    .venv/bin/python -m bench.time_to_solve --env LunarLander-v3

Both are evaluated the same way: the mean return of 10 greedy episodes every
5,000 env steps; the first evaluation at or above the target counts (475 for
CartPole, 200 for LunarLander). rlfleet's time runs from launching
`rlfleet up` (services started from cold) to that evaluation. SB3 runs the
rl-baselines3-zoo hyperparameters for the env, at its best: envs built with
render_mode=None (rgb_array leaks LunarLander particles and slows it 4-5x),
one torch thread (faster than two for these small nets on 2 cores). A
run that never reaches the target within the zoo's step budget counts as the
wall time it took to spend that budget, and is reported as such. The runs
alternate (rlfleet seed 0, SB3 seed 0, rlfleet seed 1, ...).

Also measured, each with its ceiling: env steps/s per rlfleet actor against
raw gymnasium stepping with random actions, and learner updates/s against a
plain in-process PyTorch loop of the same network and batch size.

Last line: one JSON object; ``ratio`` = rlfleet / SB3 median wall seconds.
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

import gymnasium as gym
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent

# rl-baselines3-zoo hyperparams/dqn.yml (LunarLander-v2 entry for v3).
ZOO: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(
        n_timesteps=50_000, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
        gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
        exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
    ),
    "LunarLander-v3": dict(
        n_timesteps=100_000, learning_rate=6.3e-4, batch_size=128, buffer_size=50_000, learning_starts=0,
        gamma=0.99, target_update_interval=250, train_freq=4, gradient_steps=-1, exploration_fraction=0.12,
        exploration_final_eps=0.1, policy_kwargs=dict(net_arch=[256, 256]),
    ),
}
TARGETS = {"CartPole-v1": 475.0, "LunarLander-v3": 200.0}
CONFIGS = {"CartPole-v1": "configs/cartpole-dqn.yaml", "LunarLander-v3": "configs/lunarlander-dqn.yaml"}
EVAL_EVERY, EVAL_EPISODES = 5000, 10


def run_rlfleet(env_id: str, seed: int, actors: int, budget: int, extra: list[str]) -> dict[str, Any]:
    runs = Path(tempfile.mkdtemp(prefix="tts-"))
    cmd = [
        sys.executable, "-m", "cli", "up", "--config", str(ROOT / CONFIGS[env_id]),
        "--actors", str(actors), "--until-return", str(TARGETS[env_id]), "--max-env-steps", str(budget),
        "--runs", str(runs), "--set", f"seed={seed}", "--set", f"evaluator.every_steps={EVAL_EVERY}",
        "--set", f"evaluator.episodes={EVAL_EPISODES}", *extra,
    ]
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
    hit = next((r for r in evals if float(r["mean_return"]) >= TARGETS[env_id]
                and int(r["env_steps"]) <= budget), None)
    if solved_at is None and hit is not None:
        # The first evaluation at or above the target counts (as SB3's callback): an evaluation of
        # weights from within the budget can finish after the launcher stopped on the budget.
        solved_at = float(hit["wall_time"]) - start_epoch
    with open(run_dir / "progress.csv", newline="") as f:
        progress = list(csv.DictReader(f))
    busy = [r for r in progress if float(r["env_steps_per_s"]) > 0]
    return {
        "seed": seed,
        "solved": solved_at is not None,
        "wall_s": round(solved_at if solved_at is not None else ended, 2),
        "env_steps": int(hit["env_steps"]) if hit else int(float(progress[-1]["env_steps"])) if progress else 0,
        "env_steps_per_s": statistics.median(float(r["env_steps_per_s"]) for r in busy) if busy else 0.0,
        "updates_per_s": statistics.median(float(r["updates_per_s"]) for r in busy) if busy else 0.0,
        "run_dir": str(run_dir),
    }


def run_sb3(env_id: str, seed: int) -> dict[str, Any]:
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    hp = dict(ZOO[env_id])
    budget = hp.pop("n_timesteps")
    target = TARGETS[env_id]

    class EveryNSteps(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.hit: tuple[int, float] | None = None
            self.eval_env = gym.make(env_id, render_mode=None)

        def _on_step(self) -> bool:
            if self.num_timesteps % EVAL_EVERY:
                return True
            returns, _ = evaluate_policy(self.model, self.eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
            if float(np.mean(returns)) >= target:
                self.hit = (self.num_timesteps, time.perf_counter() - start)
                return False
            return True

    start = time.perf_counter()
    env = make_vec_env(env_id, n_envs=1, seed=seed, env_kwargs={"render_mode": None})
    model = DQN("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hp)
    cb = EveryNSteps()
    model.learn(total_timesteps=budget, callback=cb)
    took = time.perf_counter() - start
    return {"seed": seed, "solved": cb.hit is not None, "wall_s": round(cb.hit[1] if cb.hit else took, 2),
            "env_steps": cb.hit[0] if cb.hit else budget}


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
    from common import config as config_mod
    from common.algorithms.dqn.networks import build_q_network

    cfg = config_mod.load(ROOT / CONFIGS[env_id], environ={}).algorithm
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", choices=sorted(ZOO), default="CartPole-v1")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--budget-factor", type=float, default=1.0,
                    help="rlfleet's env-step budget as a multiple of the zoo's")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra rlfleet --set overrides")
    args = ap.parse_args()
    torch.set_num_threads(1)
    budget = int(ZOO[args.env]["n_timesteps"] * args.budget_factor)
    extra = [x for s in args.sets for x in ("--set", s)]
    ours, theirs = [], []
    for seed in range(args.seeds):
        ours.append(run_rlfleet(args.env, seed, args.actors, budget, extra))
        print("rlfleet", json.dumps(ours[-1]), flush=True)
        theirs.append(run_sb3(args.env, seed))
        print("sb3", json.dumps(theirs[-1]), flush=True)
    raw_steps = raw_env_steps_per_s(args.env)
    raw_updates = raw_updates_per_s(args.env)
    per_actor = median(ours, "env_steps_per_s") / args.actors
    result = {
        "env": args.env,
        "target": TARGETS[args.env],
        "actors": args.actors,
        "rlfleet": {"median_wall_s": median(ours, "wall_s"), "median_env_steps": median(ours, "env_steps"),
                    "solved": sum(r["solved"] for r in ours), "runs": len(ours)},
        "sb3": {"median_wall_s": median(theirs, "wall_s"), "median_env_steps": median(theirs, "env_steps"),
                "solved": sum(r["solved"] for r in theirs), "runs": len(theirs)},
        "ratio": round(median(ours, "wall_s") / median(theirs, "wall_s"), 3),
        "env_steps_per_s_per_actor": round(per_actor, 1),
        "raw_env_steps_per_s": round(raw_steps, 1),
        "actor_ratio": round(per_actor / raw_steps, 3),
        "learner_updates_per_s": round(median(ours, "updates_per_s"), 1),
        "raw_updates_per_s": round(raw_updates, 1),
        "learner_ratio": round(median(ours, "updates_per_s") / raw_updates, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
