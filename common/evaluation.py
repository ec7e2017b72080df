"""Greedy evaluation: what the evaluator service, `rlfleet eval` and the serial runner score a policy with.

Each evaluation runs its episodes at once (one per vector slot, the first episode of each slot
counts) with fixed seeds, so the same weights always get the same score.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from rlfleet.common.config import Experiment
from rlfleet.common.envs import make_vector_env

EVAL_SEED_OFFSET = 1_000_000


def eval_envs(cfg: Experiment, episodes: int, seed: int) -> VectorEnv:  # type: ignore[type-arg]
    """The vector env of an evaluation: one slot per episode, ``evaluator.vectorization`` if set."""
    update: dict[str, Any] = {"num_envs": episodes}
    if cfg.evaluator.vectorization is not None:
        update["vectorization"] = cfg.evaluator.vectorization
    return make_vector_env(cfg.env.model_copy(update=update), seed, training=False)


def evaluate(policy: Any, cfg: Experiment, episodes: int, seed: int,
             envs: VectorEnv | None = None) -> np.ndarray:  # type: ignore[type-arg]
    """Returns of ``episodes`` episodes acted deterministically (greedy, or the mean action), one per
    slot of a vector env, seeds seed..seed+K-1.

    ``envs``: a vector env of ``episodes`` slots to reuse (kept open; every slot is reset with its
    seed, so the result is the same as with a fresh one); None makes one and closes it.
    """
    own = envs is None
    if envs is None:
        envs = eval_envs(cfg, episodes, seed)
    try:
        obs, _ = envs.reset(seed=[seed + i for i in range(episodes)])  # type: ignore[arg-type]  # a list is allowed
        returns = np.zeros(episodes)
        running = np.ones(episodes, bool)
        while running.any():
            obs, rewards, terminated, truncated, _ = envs.step(policy.act(obs, deterministic=True)[0])
            returns[running] += np.asarray(rewards, np.float64)[running]
            running &= ~(np.asarray(terminated) | np.asarray(truncated))
        return returns
    finally:
        if own:
            envs.close()
