"""The Stable-Baselines3 TD3 peer of bench.learning.suite, with the rl-baselines3-zoo settings.

As the SAC peer (bench/peers/sb3_sac.py, whose loop it runs): envs built with render_mode=None, the
torch threads bench/peers/sb3_peers.py's PEER_THREADS gives, the zoo's hyperparameters, wall time from
building the env and the model to the first 10-episode deterministic evaluation at or above the target.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.peers.sb3_sac import run_off_policy

# rl-baselines3-zoo hyperparams/td3.yml; the rest SB3's TD3 defaults (batch 256, tau 0.005, policy delay 2,
# target policy noise 0.2 clipped at 0.5).
ZOO_TD3: dict[str, dict[str, Any]] = {
    "Pendulum-v1": dict(n_timesteps=20_000, gamma=0.98, buffer_size=200_000, learning_starts=10_000,
                        noise_std=0.1, gradient_steps=1, train_freq=1, learning_rate=1e-3,
                        policy_kwargs=dict(net_arch=[400, 300])),
}
TD3_EVAL_EVERY = {"Pendulum-v1": 1_000}


def run_sb3_td3(env_id: str, seed: int, budget: int | None = None, max_seconds: float | None = None
                ) -> dict[str, Any]:
    """SB3 TD3 with the zoo's Gaussian action noise: evaluations every TD3_EVAL_EVERY env steps."""
    import gymnasium as gym
    from stable_baselines3 import TD3
    from stable_baselines3.common.noise import NormalActionNoise

    hp = dict(ZOO_TD3[env_id])
    std = float(hp.pop("noise_std"))
    space = gym.make(env_id).action_space
    assert space.shape is not None
    hp["action_noise"] = NormalActionNoise(np.zeros(space.shape), std * np.ones(space.shape))
    return run_off_policy(TD3, hp, TD3_EVAL_EVERY[env_id], env_id, seed, budget, max_seconds)
