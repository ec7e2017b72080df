"""What bench.learning.pixels measures with: the Pong config and real Pong transitions from random play."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.common import config as config_mod
from rlfleet.common.envs import make_vector_env

CONFIG = "configs/pong-dqn.yaml"
CTX = mp.get_context("spawn")
RESULTS = Path("bench/results")


def pong_config() -> Any:
    return config_mod.load(CONFIG, [], environ={})


def transitions(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Real Pong transitions: random play through DQN's n-step adder, as an actor makes them."""
    from rlfleet.common import algorithms

    cfg = pong_config()
    algo = algorithms.get(cfg.algorithm.name)
    envs = make_vector_env(cfg.env, seed, algo.autoreset_mode)
    adder = algo.make_adder(cfg.algorithm, cfg.env.num_envs, envs.single_observation_space,
                            envs.single_action_space, algo.autoreset_mode)
    rng = np.random.default_rng(seed)
    parts: list[dict[str, np.ndarray]] = []
    n = 0
    try:
        obs, _ = envs.reset(seed=seed)
        adder.reset(obs)
        while n < count:
            actions = np.asarray(rng.integers(0, 6, cfg.env.num_envs))  # Pong's 6 actions
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            items = adder.add(actions, {}, obs, rewards, terminated, truncated, infos, 0)
            if len(items["obs"]):
                parts.append(items)
                n += len(items["obs"])
    finally:
        envs.close()
    return {k: np.concatenate([p[k] for p in parts])[:count] for k in parts[0]}


def chunks(data: dict[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
    n = len(data["obs"])
    return [{k: v[i:i + size] for k, v in data.items()} for i in range(0, n - size + 1, size)]
