"""DQN learns CartPole in one process (no services): the algorithm alone solves the task."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from common.algorithms.dqn import ALGORITHM
from common.algorithms.dqn.config import DQNConfig
from common.algorithms.dqn.learner import DQNLearner
from common.algorithms.dqn.policy import DQNPolicy
from tests.dqn_helpers import ACT_SPACE, OBS_SPACE, random_batch

# Hyperparameters that solve CartPole in ~5-30k env steps on 2 CPU cores.
CARTPOLE_CFG = dict(hidden=[64, 64], lr=1e-3, batch_size=64, target_period=100, n_step=3, gamma=0.99)


def greedy_return(policy: DQNPolicy, seed: int, episodes: int = 10) -> float:
    envs = gym.make_vec("CartPole-v1", num_envs=episodes)
    obs, _ = envs.reset(seed=seed)
    returns, done = np.zeros(episodes), np.zeros(episodes, bool)
    while not done.all():
        obs, rewards, terminated, truncated, _ = envs.step(policy.act(obs, deterministic=True)[0])
        returns += rewards * ~done
        done |= terminated | truncated
    envs.close()
    return float(returns.mean())


def test_learns_cartpole() -> None:
    seed, num_envs, budget, capacity = 0, 4, 60_000, 50_000
    cfg = DQNConfig(**CARTPOLE_CFG)
    envs = gym.make_vec("CartPole-v1", num_envs=num_envs)
    learner = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=seed)
    policy = DQNPolicy(cfg, OBS_SPACE, ACT_SPACE, seed=seed, act_seed=[seed, 1])
    adder = ALGORITHM.make_adder(cfg, num_envs, OBS_SPACE, ACT_SPACE, envs.metadata["autoreset_mode"])
    rng = np.random.default_rng(seed)
    replay = {k: np.zeros((capacity, *v.shape[1:]), v.dtype) for k, v in random_batch(rng, 1).items()}
    size = head = 0
    obs, _ = envs.reset(seed=seed)
    adder.reset(obs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small nets: one thread is fastest and deterministic
    best = 0.0
    try:
        for step in range(num_envs, budget + 1, num_envs):
            policy.epsilon = max(0.05, 1.0 - 0.95 * step / 10_000)  # this test's own schedule
            actions, extras = policy.act(obs)
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            columns = adder.add(actions, extras, obs, rewards, terminated, truncated, infos, learner.num_updates)
            rows = (head + np.arange(len(columns["action"]))) % capacity
            for key, value in columns.items():
                replay[key][rows] = value
            head, size = (head + len(rows)) % capacity, min(size + len(rows), capacity)
            if size < 1000:
                continue
            idx = rng.integers(size, size=cfg.batch_size)
            learner.learn({key: value[idx] for key, value in replay.items()})
            policy.load_weights(learner.weights())
            if step % 2000 == 0:
                best = max(best, greedy_return(policy, seed=10_000 + step))
                if best >= 195:
                    break
    finally:
        torch.set_num_threads(threads)
        envs.close()
    assert best >= 195, f"greedy mean return {best} after {step} env steps"
    # Balancing alone can be learnt from short-sighted values (CartPole forgives
    # a lot); bootstrapping shows in Q: without it Q(s0) <= 1 + g + g^2 < 3.
    starts = gym.make_vec("CartPole-v1", num_envs=8)
    start, _ = starts.reset(seed=seed)
    starts.close()
    q_start = float(policy.q_values(start).max(axis=1).mean())
    assert q_start > 10, f"Q(s0) = {q_start}: values do not propagate past the n-step horizon"
