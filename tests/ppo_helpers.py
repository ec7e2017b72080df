"""What the PPO tests share: a one-process training loop (vector env -> policy -> adder -> learner)
and a deterministic evaluation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from common.algorithms.ppo import ALGORITHM
from common.algorithms.ppo.config import PPOConfig


def evaluate(policy: Any, make_env: Callable[[], gym.Env], seed: int, episodes: int = 10) -> float:
    """Mean return of ``episodes`` deterministic episodes."""
    envs = gym.vector.SyncVectorEnv([make_env] * episodes)
    obs, _ = envs.reset(seed=seed)
    returns, done = np.zeros(episodes), np.zeros(episodes, bool)
    while not done.all():
        obs, rewards, terminated, truncated, _ = envs.step(policy.act(obs, deterministic=True)[0])
        returns += rewards * ~done
        done |= terminated | truncated
    envs.close()
    return float(returns.mean())


def train(cfg: PPOConfig, make_env: Callable[[], gym.Env], num_envs: int, budget: int, target: float,
          seed: int = 0, eval_every: int = 10) -> tuple[float, int]:
    """Train until the evaluation reaches ``target`` or ``budget`` env steps; (best return, env steps)."""
    envs = gym.vector.SyncVectorEnv([make_env] * num_envs)
    space = envs.single_observation_space, envs.single_action_space
    learner = ALGORITHM.make_learner(cfg, *space, device="cpu", seed=seed)
    policy = ALGORITHM.make_policy(cfg, *space, seed=seed, act_seed=[seed, 1])
    adder = ALGORITHM.make_adder(cfg, num_envs, *space, envs.metadata["autoreset_mode"])
    obs, _ = envs.reset(seed=seed)
    adder.reset(obs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    best, steps, version, pending = -np.inf, 0, 0, []
    try:
        while steps < budget:
            actions, extras = policy.act(obs)
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            steps += num_envs
            items = adder.add(actions, extras, obs, rewards, terminated, truncated, infos, version)
            if len(items["version"]):
                pending.append(items)
            if sum(len(p["version"]) for p in pending) < num_envs:
                continue
            batch = {key: np.concatenate([p[key] for p in pending]) for key in pending[0]}
            pending = []
            learner.learn(batch)
            version += 1
            policy.load_weights(learner.weights())
            if version % eval_every == 0:
                best = max(best, evaluate(policy, make_env, seed=10_000 + version))
                if best >= target:
                    break
    finally:
        torch.set_num_threads(threads)
        envs.close()
    return best, steps
