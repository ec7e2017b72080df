"""The Stable-Baselines3 Atari peers of bench.learning.suite's pixel rows: DQN (pong-dqn) and PPO
(breakout-ppo) with the rl-baselines3-zoo's ``atari`` entries, on the fleet's own envs.

Both sides see the same observations: the peer's envs are those of the row's config
(common.envs.env_factory: ALE v5 at one emulator frame a step, 0-30 no-ops, a frame skip of 4 with the
last two frames max-pooled, 84x84 grey, a lost life ends a training episode, FIRE after resets, rewards
clipped to their sign, 4 frames stacked first), and its evaluations are the fleet evaluator's
(common.evaluation.eval_envs: 10 whole games, real scores, greedy, on seeds seed + 1,000,000 + i). That is
the zoo's AtariWrapper and VecFrameStack(4) on NoFrameskip-v4 (sticky actions off: the configs set
repeat_action_probability 0, v5's default being 0.25), with two differences: each frame is turned grey
before the max-pool (gymnasium's AtariPreprocessing), not after (SB3's), and the zoo evaluates Atari
agents stochastically where both sides here act greedily. As the other peers (bench/peers/sb3_peers.py):
the zoo's values, wall time from building the envs and the model, a wall budget (``max_seconds``) as
well as the env-step budget.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.peers.sb3_peers import (
    EVAL_EPISODES,
    crossing,
    evaluations,
    once_per_update,
    peer_result,
    zoo_ppo_kwargs,
)

ROOT = Path(__file__).resolve().parents[2]
# The config whose env (and preprocessing) each Atari peer plays: its suite row's.
ATARI_CONFIGS = {"ALE/Pong-v5": "pong-dqn.yaml", "ALE/Breakout-v5": "breakout-ppo.yaml"}
ATARI_EVAL_EVERY = {"ALE/Pong-v5": 50_000, "ALE/Breakout-v5": 50_000}  # the rows' `every`

# rl-baselines3-zoo hyperparams/dqn.yml, `atari` (CnnPolicy; the replay holds each transition's two stacks,
# about 5.6 GB full, as the zoo's optimize_memory_usage False).
ZOO_ATARI_DQN: dict[str, Any] = dict(
    n_timesteps=10_000_000, buffer_size=100_000, learning_rate=1e-4, batch_size=32, learning_starts=100_000,
    target_update_interval=1000, train_freq=4, gradient_steps=1, exploration_fraction=0.1,
    exploration_final_eps=0.01, optimize_memory_usage=False,
)
# rl-baselines3-zoo hyperparams/ppo.yml, `atari` (CnnPolicy), in ZOO_PPO's form: lin_X falls to 0 over 1e7 steps.
ZOO_ATARI_PPO: dict[str, Any] = dict(
    n_envs=8, anneal=10_000_000, n_steps=128, n_epochs=4, batch_size=256, learning_rate="lin_2.5e-4",
    clip_range="lin_0.1", vf_coef=0.5, ent_coef=0.01,
)


def run_sb3_atari_dqn(env_id: str, seed: int, budget: int | None = None, max_seconds: float | None = None
                      ) -> dict[str, Any]:
    """SB3 DQN on one env, evaluated every ATARI_EVAL_EVERY env steps; epsilon falls over the zoo's first
    10% of 1e7 env steps whatever the budget."""
    from stable_baselines3 import DQN

    hp = dict(ZOO_ATARI_DQN)
    zoo_budget = int(hp.pop("n_timesteps"))
    budget = budget or zoo_budget
    hp["exploration_fraction"] *= zoo_budget / budget
    return run_atari(DQN, hp, 1, crossing(ATARI_EVAL_EVERY[env_id]), env_id, seed, budget, max_seconds)


def run_sb3_atari_ppo(env_id: str, seed: int, budget: int | None = None, max_seconds: float | None = None
                      ) -> dict[str, Any]:
    """SB3 PPO on the zoo's 8 envs, evaluated once the env steps pass each multiple of ATARI_EVAL_EVERY."""
    from stable_baselines3 import PPO

    budget = budget or int(ZOO_ATARI_PPO["anneal"])
    n_envs, hp = zoo_ppo_kwargs(ZOO_ATARI_PPO, budget)
    return run_atari(PPO, hp, n_envs, once_per_update(ATARI_EVAL_EVERY[env_id]), env_id, seed, budget,
                     max_seconds)


def run_atari(algorithm: Any, hp: dict[str, Any], n_envs: int, due: Any, env_id: str, seed: int, budget: int,
              max_seconds: float | None) -> dict[str, Any]:
    """One SB3 learner with a CnnPolicy on ``n_envs`` of the row config's training envs."""
    from stable_baselines3.common.env_util import make_vec_env

    from rlfleet.common import config as config_mod
    from rlfleet.common.envs import env_factory
    from rlfleet.common.evaluation import eval_envs

    cfg = config_mod.load(ROOT / "configs" / ATARI_CONFIGS[env_id], environ={})
    assert cfg.env.id == env_id, (cfg.env.id, env_id)
    start = time.perf_counter()
    env = make_vec_env(env_factory(cfg.env, training=True), n_envs=n_envs, seed=seed)
    model = algorithm("CnnPolicy", env, seed=seed, device="cpu", verbose=0, **hp)
    cb = evaluations(env_id, seed, start, due, max_seconds, lambda: eval_envs(cfg, EVAL_EPISODES, seed))
    model.learn(total_timesteps=budget, callback=cb)
    return {**peer_result(seed, cb, model, start), "budget": budget}
