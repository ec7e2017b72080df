"""The Stable-Baselines3 A2C peer of bench.learning.time_to_solve --algo a3c, with the rl-baselines3-zoo
settings.

As the other peers (bench/peers/sb3_peers.py): envs built with render_mode=None, the torch threads
bench/peers/sb3_peers.py's PEER_THREADS gives (set by the caller), the zoo's hyperparameters
(hyperparams/a2c.yml: CartPole-v1 with 8 envs, ent_coef 0.0, n_timesteps 5e5; LunarLander-v2, run
on v3, with 8 envs, gamma 0.995, ent_coef 1e-5 and lr 8.3e-4 falling linearly to 0, n_timesteps 2e5;
the rest SB3's A2C defaults: n_steps 5, RMSprop lr 7e-4; a linear lr falls over the budget the run
is given, as SB3's progress does, so a budget above the zoo's keeps learning instead of stopping at
2e5), wall time from building the envs and the model to the first 10-episode deterministic
evaluation at or above the target (evaluations included), the same fixed evaluation seeds as
rlfleet's evaluator.
"""

from __future__ import annotations

import time
from typing import Any

from bench.peers.sb3_peers import crossing, evaluations, peer_result

ZOO_A2C: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(n_envs=8, n_timesteps=500_000, ent_coef=0.0),
    "LunarLander-v3": dict(n_envs=8, n_timesteps=200_000, gamma=0.995, n_steps=5, ent_coef=0.00001,
                           learning_rate="lin_0.00083"),
}
A2C_EVAL_EVERY = {"CartPole-v1": 5_000, "LunarLander-v3": 10_000}
A2C_BUDGET = {env: int(hp["n_timesteps"]) for env, hp in ZOO_A2C.items()}


def run_sb3_a2c(env_id: str, seed: int, budget: int | None = None, max_seconds: float | None = None
                ) -> dict[str, Any]:
    """SB3 A2C: evaluations once the env steps pass each multiple of A2C_EVAL_EVERY."""
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    hp = dict(ZOO_A2C[env_id])
    n_envs = int(hp.pop("n_envs"))
    budget = budget or int(hp.pop("n_timesteps"))
    hp.pop("n_timesteps", None)
    lr = hp.get("learning_rate")
    if isinstance(lr, str) and lr.startswith("lin_"):  # the zoo's linear schedule: progress 1 -> 0
        initial = float(lr.removeprefix("lin_"))
        hp["learning_rate"] = lambda progress: progress * initial
    start = time.perf_counter()
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed, env_kwargs={"render_mode": None})
    model = A2C("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hp)
    cb = evaluations(env_id, seed, start, crossing(A2C_EVAL_EVERY[env_id]), max_seconds)
    model.learn(total_timesteps=budget, callback=cb)
    return {**peer_result(seed, cb, model, start), "budget": budget}
