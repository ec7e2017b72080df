"""The evaluation every peer runner applies to its policy: rlfleet's evaluator logic with numpy and gymnasium only.

Imported by the runners inside the peers' own virtualenvs (.peers/), so it needs nothing of rlfleet: the same
10 greedy episodes on the same fixed seeds as common/evaluation.py (slot i seeded seed + EVAL_SEED_OFFSET + i,
the first episode of each slot counts), the same schedule (due once each time the env steps pass a multiple of
the interval) and the same result line (what bench.learning.time_to_solve reads).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

EVAL_SEED_OFFSET = 1_000_000  # common/evaluation.py's: a test checks the two agree
EVAL_EPISODES = 10

# obs batch (episodes x obs dims, float32) -> greedy actions, one per row
GreedyPolicy = Callable[[np.ndarray], np.ndarray]


def greedy_returns(act: GreedyPolicy, env_id: str, seed: int, episodes: int = EVAL_EPISODES) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes acted in lockstep, env i reset with seed + EVAL_SEED_OFFSET + i."""
    envs = [gym.make(env_id, render_mode=None) for _ in range(episodes)]
    try:
        obs = np.stack([env.reset(seed=seed + EVAL_SEED_OFFSET + i)[0] for i, env in enumerate(envs)])
        returns, running = np.zeros(episodes), np.ones(episodes, bool)
        while running.any():
            actions = np.asarray(act(obs.astype(np.float32)))
            for i in np.flatnonzero(running):
                obs[i], reward, terminated, truncated, _ = envs[i].step(actions[i].item())
                returns[i] += float(reward)
                running[i] = not (terminated or truncated)
        return returns
    finally:
        for env in envs:
            env.close()


class Evaluations:
    """The evaluations of one peer run: due each time the env steps pass a multiple of ``every``; the clock
    runs from ``start_epoch`` (when the benchmark launched the runner, start-up included). Only weights from
    within ``budget`` env steps can solve (as rlfleet's side: a peer that trains on while it evaluates may
    pass its budget first)."""

    def __init__(self, env_id: str, seed: int, every: int, target: float | None, start_epoch: float,
                 budget: int | None = None) -> None:
        self.env_id, self.seed, self.every, self.target = env_id, seed, every, target
        self.budget = budget
        self.start_epoch = start_epoch
        self.next_at = every
        self.curve: list[list[float]] = []  # [env steps, wall seconds from launch, mean return]
        self.hit: tuple[int, float] | None = None

    def due(self, env_steps: int) -> bool:
        return env_steps >= self.next_at

    def evaluate(self, act: GreedyPolicy, env_steps: int) -> bool:
        """Evaluate now; True once the mean return reached the target."""
        self.next_at = (env_steps // self.every + 1) * self.every
        mean = float(greedy_returns(act, self.env_id, self.seed).mean())
        wall = time.time() - self.start_epoch
        self.curve.append([env_steps, round(wall, 2), round(mean, 2)])
        within = self.budget is None or env_steps <= self.budget
        if self.target is not None and mean >= self.target and within and self.hit is None:
            self.hit = (env_steps, wall)
        return self.hit is not None

    def result(self, env_steps: int, **extra: Any) -> dict[str, Any]:
        """The run's JSON object: an unsolved run reports the wall time it took to spend its budget."""
        wall = self.hit[1] if self.hit else time.time() - self.start_epoch
        steps = self.hit[0] if self.hit else env_steps if self.budget is None else min(env_steps, self.budget)
        return {"seed": self.seed, "solved": self.hit is not None, "wall_s": round(wall, 2), "env_steps": steps,
                "env_steps_per_s": round(steps / wall, 1) if wall > 0 else 0.0, "evaluations": self.curve,
                "best_return": max((c[2] for c in self.curve), default=None), **extra}


def print_result(result: dict[str, Any]) -> None:
    """The runner's last stdout line: what bench.learning.time_to_solve parses."""
    print(json.dumps(result), flush=True)
