"""The Stable-Baselines3 peers of bench.learning.time_to_solve: DQN and PPO with the rl-baselines3-zoo settings.

Each peer runs at its best on this machine: envs built with render_mode=None (rgb_array leaks
LunarLander particles and slows it 4-5x), the faster of one torch thread and one per core
(PEER_THREADS, :func:`run_peer`), the zoo's hyperparameters for the env. Its wall time runs from
building the envs and the model (start-up) to the first evaluation at or above the target,
evaluations included; a run that never reaches the target within its budget reports the wall time it
took to spend that budget. A peer given a wall budget (``max_seconds``, the heavy rows of bench.learning.suite)
also stops there, counted from the same start, checked at every env step; a learning phase under way
(PPO's epochs after a rollout) finishes first, and so does an evaluation, within EVAL_GRACE_S.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np

TARGETS = {"CartPole-v1": 475.0, "LunarLander-v3": 200.0, "Pendulum-v1": -200.0,
           "LunarLanderContinuous-v3": 200.0, "MountainCarContinuous-v0": 90.0}

# rl-baselines3-zoo hyperparams/dqn.yml (LunarLander-v2 entry for v3).
ZOO_DQN: dict[str, dict[str, Any]] = {
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
DQN_EVAL_EVERY, EVAL_EPISODES = 5000, 10
# Torch threads of each peer: the faster of 1 and one per core (torch's own default). Measured on 2 cores,
# env steps/s of `learn` (zoo settings, learning under way) with 1 / 2 threads: DQN CartPole 1,388 / 1,678,
# DQN LunarLander 547 / 598, SAC Pendulum 86 / 130, SAC LunarLanderContinuous 53 / 71; PPO CartPole
# 6,447 / 6,732 and LunarLander 8,395 / 8,247 (within the noise: one, as its published runs), A2C CartPole
# 14,572 / 13,846.
CORES = len(os.sched_getaffinity(0))
# The Atari peers' (bench/peers/sb3_atari.py): one per core, torch's default, not measured against 1.
PEER_THREADS = {"dqn": CORES, "sac": CORES, "td3": CORES, "ppo": 1, "a3c": 1, "dqn-atari": CORES, "ppo-atari": CORES}

# rl-baselines3-zoo hyperparams/ppo.yml (LunarLander-v2 entry for v3), default MlpPolicy. "lin_X" is
# X falling linearly to 0 over the zoo's n_timesteps ("anneal"), whatever budget the run is given.
ZOO_PPO: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(
        n_envs=8, anneal=100_000, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
        ent_coef=0.0, learning_rate="lin_1e-3", clip_range="lin_0.2",
    ),
    "LunarLander-v3": dict(
        n_envs=16, anneal=1_000_000, n_steps=1024, batch_size=64, n_epochs=4, gae_lambda=0.98, gamma=0.999,
        ent_coef=0.01,
    ),
    "LunarLanderContinuous-v3": dict(  # the zoo's LunarLanderContinuous-v2 entry: LunarLander's settings
        n_envs=16, anneal=1_000_000, n_steps=1024, batch_size=64, n_epochs=4, gae_lambda=0.98, gamma=0.999,
        ent_coef=0.01,
    ),
}
# Env-step budgets and evaluation intervals of the PPO comparison (both sides).
PPO_BUDGET = {"CartPole-v1": 200_000, "LunarLander-v3": 1_500_000, "LunarLanderContinuous-v3": 1_500_000}
PPO_EVAL_EVERY = {"CartPole-v1": 2_000, "LunarLander-v3": 10_000, "LunarLanderContinuous-v3": 10_000}
# The evaluation seeds: the same fixed seeds every evaluation, as rlfleet's evaluator (seed + 1,000,000 + i).
EVAL_SEED_OFFSET = 1_000_000
# How long past a wall budget an evaluation under way may go on and count: as the fleet's, whose evaluator
# finishes the one under way when stopped, within the launcher's stop timeout (cli/launcher.py, Fleet.stop).
EVAL_GRACE_S = 20.0


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the body with ``n`` torch intra-op threads, the caller's count restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_peer(peer: Callable[..., dict[str, Any]], threads: int, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """One peer run with ``threads`` torch threads; the count goes into its result."""
    with torch_threads(threads):
        result = peer(*args, **kwargs)
    return {**result, "torch_threads": threads}


def run_sb3_dqn(env_id: str, seed: int, budget: int | None = None, max_seconds: float | None = None
                ) -> dict[str, Any]:
    """SB3 DQN: 10 deterministic episodes on one env every 5,000 env steps; budget: the zoo's n_timesteps
    unless given (epsilon then falls over as many env steps as in the zoo's run), and ``max_seconds``."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    hp = dict(ZOO_DQN[env_id])
    zoo_budget = int(hp.pop("n_timesteps"))
    budget = budget or zoo_budget
    hp["exploration_fraction"] *= zoo_budget / budget  # the zoo's schedule in env steps, whatever the budget
    target = TARGETS[env_id]

    class EveryNSteps(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.hit: tuple[int, float] | None = None
            self.eval_env = gym.make(env_id, render_mode=None)
            self.curve: list[list[float]] = []

        def _on_step(self) -> bool:
            if max_seconds is not None and time.perf_counter() - start >= max_seconds:
                return False
            if self.num_timesteps % DQN_EVAL_EVERY:
                return True
            returns, _ = evaluate_policy(self.model, self.eval_env, n_eval_episodes=EVAL_EPISODES,
                                         deterministic=True)
            self.curve.append([self.num_timesteps, round(time.perf_counter() - start, 2),
                               round(float(np.mean(returns)), 2)])
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
    cb.eval_env.close()
    env.close()
    return {"seed": seed, "solved": cb.hit is not None, "wall_s": round(cb.hit[1] if cb.hit else took, 2),
            "env_steps": cb.hit[0] if cb.hit else int(model.num_timesteps),
            "best_return": max((c[2] for c in cb.curve), default=None), "curve": cb.curve}


def _linear(value: float, anneal: int, budget: int) -> Callable[[float], float]:
    """SB3 schedules see progress_remaining = 1 - steps / budget; the zoo's lin_X reaches 0 at ``anneal`` steps."""
    def schedule(progress_remaining: float) -> float:
        steps = (1.0 - progress_remaining) * budget
        return value * max(0.0, 1.0 - steps / anneal)
    return schedule


def ppo_kwargs(env_id: str, budget: int) -> tuple[int, dict[str, Any]]:
    """(n_envs, PPO keyword arguments) of the zoo's entry, lin_X turned into schedules."""
    return zoo_ppo_kwargs(ZOO_PPO[env_id], budget)


def zoo_ppo_kwargs(zoo: dict[str, Any], budget: int) -> tuple[int, dict[str, Any]]:
    """(n_envs, PPO keyword arguments) of a zoo entry as ZOO_PPO holds them, lin_X turned into schedules."""
    hp = dict(zoo)
    n_envs, anneal = int(hp.pop("n_envs")), int(hp.pop("anneal"))
    for key in ("learning_rate", "clip_range"):
        if isinstance(hp.get(key), str) and hp[key].startswith("lin_"):
            hp[key] = _linear(float(hp[key][4:]), anneal, budget)
    return n_envs, hp


def deterministic_returns(model: Any, envs: gym.vector.VectorEnv, seed: int,  # type: ignore[type-arg]
                          deadline: float | None = None) -> np.ndarray | None:
    """One deterministic episode per slot, slots seeded seed..seed+K-1 (as rlfleet's evaluator); None if
    ``deadline`` (a time.perf_counter reading) passed first."""
    k = envs.num_envs
    obs, _ = envs.reset(seed=[seed + i for i in range(k)])  # type: ignore[arg-type]  # a list is allowed
    returns, running = np.zeros(k), np.ones(k, bool)
    while running.any():
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        actions, _ = model.predict(obs, deterministic=True)
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        returns[running] += np.asarray(rewards, np.float64)[running]
        running &= ~(np.asarray(terminated) | np.asarray(truncated))
    return returns


def evaluations(env_id: str, seed: int, start: float, due: Callable[[Any, int], bool],
                max_seconds: float | None = None,
                make_eval_envs: Callable[[], gym.vector.VectorEnv] | None = None) -> Any:  # type: ignore[type-arg]
    """An SB3 callback: 10 deterministic episodes (10 vector slots, fixed seeds) at each step where
    ``due(model, num_timesteps)``; stops learning at the first mean at or above the env's target (none: a
    heavy env, run to its budgets) and once ``max_seconds`` have passed since ``start`` (an evaluation under
    way then has EVAL_GRACE_S more to end and count).
    ``make_eval_envs``: the evaluation's vector env of 10 slots (default: ``gym.make(env_id)`` in each)."""
    from stable_baselines3.common.callbacks import BaseCallback

    target = TARGETS.get(env_id)
    deadline = None if max_seconds is None else start + max_seconds

    class Evaluations(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.hit: tuple[int, float] | None = None
            self.evals = 0
            self.out_of_time = False
            self.curve: list[list[float]] = []  # [env steps, wall seconds, mean return] per evaluation
            self.eval_envs: gym.vector.VectorEnv | None = None  # type: ignore[type-arg]  # at the first evaluation

        def envs(self) -> gym.vector.VectorEnv:  # type: ignore[type-arg]
            if self.eval_envs is None:
                self.eval_envs = make_eval_envs() if make_eval_envs else gym.vector.SyncVectorEnv(
                    [lambda: gym.make(env_id, render_mode=None) for _ in range(EVAL_EPISODES)])
            return self.eval_envs

        def _on_step(self) -> bool:
            if deadline is not None and time.perf_counter() >= deadline:
                self.out_of_time = True
                return False
            if not due(self.model, self.num_timesteps):
                return True
            returns = deterministic_returns(self.model, self.envs(), seed + EVAL_SEED_OFFSET,
                                            None if deadline is None else deadline + EVAL_GRACE_S)
            if returns is None:
                self.out_of_time = True
                return False
            self.evals += 1
            self.curve.append([self.num_timesteps, round(time.perf_counter() - start, 2),
                               round(float(returns.mean()), 2)])
            if target is not None and float(returns.mean()) >= target:
                self.hit = (self.num_timesteps, time.perf_counter() - start)
                return False
            self.out_of_time = deadline is not None and time.perf_counter() >= deadline
            return not self.out_of_time

    return Evaluations()


def peer_result(seed: int, cb: Any, model: Any, start: float) -> dict[str, Any]:
    """A peer run's figures once ``model.learn`` returned (``cb``: its :func:`evaluations`); closes its envs.
    ``out_of_time``: the wall budget stopped it."""
    took = time.perf_counter() - start
    if cb.eval_envs is not None:
        cb.eval_envs.close()
    model.get_env().close()
    wall = cb.hit[1] if cb.hit else took
    steps = cb.hit[0] if cb.hit else int(model.num_timesteps)
    return {"seed": seed, "solved": cb.hit is not None, "wall_s": round(wall, 2), "env_steps": steps,
            "env_steps_per_s": round(steps / wall, 1) if wall > 0 else 0.0, "evaluations": cb.evals,
            "out_of_time": cb.out_of_time,
            "best_return": max((c[2] for c in cb.curve), default=None), "curve": cb.curve}


def crossing(every: int) -> Callable[[Any, int], bool]:
    """An evaluation schedule for :func:`evaluations`: due once each time the env steps pass a multiple of
    ``every`` (a vectorised learner's steps jump by its env count, so they rarely hit one exactly)."""
    state = {"next_at": every}

    def due(_model: Any, steps: int) -> bool:
        if steps < state["next_at"]:
            return False
        state["next_at"] = (steps // every + 1) * every
        return True

    return due


def once_per_update(every: int) -> Callable[[Any, int], bool]:
    """:func:`crossing` for an on-policy learner, skipped while the weights are those already evaluated
    (PPO learns once a rollout)."""
    state = {"evaluated": -1}  # model._n_updates at the last evaluation
    passed = crossing(every)

    def due(model: Any, steps: int) -> bool:
        if not passed(model, steps):
            return False
        updates = int(model._n_updates)
        if updates == state["evaluated"]:
            return False
        state["evaluated"] = updates
        return True

    return due


def run_sb3_ppo(env_id: str, seed: int, budget: int | None = None, max_seconds: float | None = None
                ) -> dict[str, Any]:
    """SB3 PPO: evaluations once the env steps pass each multiple of PPO_EVAL_EVERY, once per update."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    budget = budget or PPO_BUDGET[env_id]
    n_envs, hp = ppo_kwargs(env_id, budget)
    start = time.perf_counter()
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed, env_kwargs={"render_mode": None})
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hp)
    cb = evaluations(env_id, seed, start, once_per_update(PPO_EVAL_EVERY[env_id]), max_seconds)
    model.learn(total_timesteps=budget, callback=cb)
    return peer_result(seed, cb, model, start)
