"""The Stable-Baselines3 SAC peer of bench.time_to_solve --algo sac, with the rl-baselines3-zoo settings.

As the other peers (bench/sb3_peers.py): envs built with render_mode=None, one torch thread (set
by the caller), the zoo's hyperparameters, wall time from building the env and the model to the
first 10-episode deterministic evaluation at or above the target (evaluations included), the
same fixed evaluation seeds as rlfleet's evaluator.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym

from bench.sb3_peers import EVAL_EPISODES, EVAL_SEED_OFFSET, TARGETS, deterministic_returns

# rl-baselines3-zoo hyperparams/sac.yml (LunarLanderContinuous-v2 entry for v3); the rest SB3's defaults.
ZOO_SAC: dict[str, dict[str, Any]] = {
    "Pendulum-v1": dict(n_timesteps=20_000, learning_rate=1e-3),
    "LunarLanderContinuous-v3": dict(
        n_timesteps=500_000, learning_rate=7.3e-4, buffer_size=1_000_000, batch_size=256, ent_coef="auto",
        gamma=0.99, tau=0.01, train_freq=1, gradient_steps=1, learning_starts=10_000,
        policy_kwargs=dict(net_arch=[400, 300]),
    ),
}
SAC_EVAL_EVERY = {"Pendulum-v1": 1_000, "LunarLanderContinuous-v3": 10_000}
SAC_BUDGET = {env: int(hp["n_timesteps"]) for env, hp in ZOO_SAC.items()}


def run_sb3_sac(env_id: str, seed: int, budget: int | None = None) -> dict[str, Any]:
    """SB3 SAC: 10 deterministic episodes (10 vector slots, fixed seeds) every SAC_EVAL_EVERY env steps."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    hp = dict(ZOO_SAC[env_id])
    budget = budget or int(hp["n_timesteps"])
    hp.pop("n_timesteps")
    every, target = SAC_EVAL_EVERY[env_id], TARGETS[env_id]

    class Evaluations(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.hit: tuple[int, float] | None = None
            self.evals = 0
            self.eval_envs = gym.vector.SyncVectorEnv(
                [lambda: gym.make(env_id, render_mode=None) for _ in range(EVAL_EPISODES)])

        def _on_step(self) -> bool:
            if self.num_timesteps % every:
                return True
            self.evals += 1
            returns = deterministic_returns(self.model, self.eval_envs, seed + EVAL_SEED_OFFSET)
            if float(returns.mean()) >= target:
                self.hit = (self.num_timesteps, time.perf_counter() - start)
                return False
            return True

    start = time.perf_counter()
    env = gym.make(env_id, render_mode=None)
    model = SAC("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hp)
    cb = Evaluations()
    model.learn(total_timesteps=budget, callback=cb)
    took = time.perf_counter() - start
    cb.eval_envs.close()
    wall = cb.hit[1] if cb.hit else took
    steps = cb.hit[0] if cb.hit else int(model.num_timesteps)
    return {"seed": seed, "solved": cb.hit is not None, "wall_s": round(wall, 2), "env_steps": steps,
            "env_steps_per_s": round(steps / wall, 1), "steps_per_wall_s": round(steps / wall, 1),
            "evaluations": cb.evals, "budget": budget}
