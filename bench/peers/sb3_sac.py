"""The Stable-Baselines3 SAC peer of bench.learning.time_to_solve --algo sac, with the rl-baselines3-zoo
settings, and the loop every SB3 off-policy peer runs (TD3's: bench/peers/sb3_td3.py).

As the other peers (bench/peers/sb3_peers.py): envs built with render_mode=None, the torch threads
bench/peers/sb3_peers.py's PEER_THREADS gives (set by the caller), the zoo's hyperparameters, wall time
from building the env and the model to the first 10-episode deterministic evaluation at or above the
target (evaluations included), the same fixed evaluation seeds as rlfleet's evaluator.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym

from bench.peers.sb3_peers import evaluations, peer_result

# rl-baselines3-zoo hyperparams/sac.yml (LunarLanderContinuous-v2 entry for v3); the rest SB3's defaults.
ZOO_SAC: dict[str, dict[str, Any]] = {
    "Pendulum-v1": dict(n_timesteps=20_000, learning_rate=1e-3),
    "LunarLanderContinuous-v3": dict(
        n_timesteps=500_000, learning_rate=7.3e-4, buffer_size=1_000_000, batch_size=256, ent_coef="auto",
        gamma=0.99, tau=0.01, train_freq=1, gradient_steps=1, learning_starts=10_000,
        policy_kwargs=dict(net_arch=[400, 300]),
    ),
}
ZOO_SAC["MountainCarContinuous-v0"] = dict(  # gSDE: state-dependent exploration, which rlfleet's SAC lacks
    n_timesteps=50_000, learning_rate=3e-4, buffer_size=50_000, batch_size=512, ent_coef=0.1, train_freq=32,
    gradient_steps=32, gamma=0.9999, tau=0.01, learning_starts=0, use_sde=True,
    policy_kwargs=dict(log_std_init=-3.67, net_arch=[64, 64]),
)
# The heavy rows of bench.learning.suite, run to a wall budget. BipedalWalker-v3: the zoo's entry, gSDE
# again (64 updates every 64 env steps: the same ratio as the fleet's one per step). Hopper-v5: the zoo's
# Hopper-v4 entry (its MuJoCo defaults: SB3's SAC defaults with 10,000 random steps); v5 differs from v4 only
# in not paying the healthy reward on the step the hopper falls, which ends the episode in both.
ZOO_SAC["BipedalWalker-v3"] = dict(
    n_timesteps=500_000, learning_rate=7.3e-4, buffer_size=300_000, batch_size=256, ent_coef="auto", gamma=0.98,
    tau=0.02, train_freq=64, gradient_steps=64, learning_starts=10_000, use_sde=True,
    policy_kwargs=dict(log_std_init=-3, net_arch=[400, 300]),
)
ZOO_SAC["Hopper-v5"] = dict(n_timesteps=1_000_000, learning_starts=10_000)
SAC_EVAL_EVERY = {"Pendulum-v1": 1_000, "LunarLanderContinuous-v3": 10_000, "MountainCarContinuous-v0": 2_000,
                  "BipedalWalker-v3": 20_000, "Hopper-v5": 20_000}
SAC_BUDGET = {env: int(hp["n_timesteps"]) for env, hp in ZOO_SAC.items()}


def run_sb3_sac(env_id: str, seed: int, budget: int | None = None, max_seconds: float | None = None
                ) -> dict[str, Any]:
    """SB3 SAC: evaluations every SAC_EVAL_EVERY env steps (it learns every step)."""
    from stable_baselines3 import SAC

    return run_off_policy(SAC, ZOO_SAC[env_id], SAC_EVAL_EVERY[env_id], env_id, seed, budget, max_seconds)


def run_off_policy(algorithm: Any, zoo: dict[str, Any], every: int, env_id: str, seed: int,
                   budget: int | None = None, max_seconds: float | None = None) -> dict[str, Any]:
    """One SB3 off-policy learner (SAC, TD3) of the zoo's settings ``zoo`` on one env, evaluated every
    ``every`` env steps; budget: the zoo's n_timesteps unless given, and ``max_seconds`` of wall time."""
    hp = dict(zoo)
    budget = budget or int(hp.pop("n_timesteps"))
    hp.pop("n_timesteps", None)
    start = time.perf_counter()
    env = gym.make(env_id, render_mode=None)
    model = algorithm("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hp)
    cb = evaluations(env_id, seed, start, lambda _model, steps: steps % every == 0, max_seconds)
    model.learn(total_timesteps=budget, callback=cb)
    result = peer_result(seed, cb, model, start)
    return {**result, "steps_per_wall_s": result["env_steps_per_s"], "budget": budget}
