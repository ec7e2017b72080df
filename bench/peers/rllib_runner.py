"""RLlib 2.60 (new API stack) as a peer of bench.learning.time_to_solve: run by .peers/rllib's python.

    .peers/rllib/bin/python bench/peers/rllib_runner.py --algo PPO|DQN --env ENV --seed S --budget STEPS
        --eval-every STEPS [--target R] [--start-epoch T]

Settings: RLlib's own tuned examples where it has one for the env (rllib/tuned_examples/ppo/cartpole_ppo.py,
rllib/tuned_examples/dqn/cartpole_dqn.py), otherwise the rl-baselines3-zoo's hyperparameters mapped onto
RLlib's names (LunarLander PPO; DQN's LunarLander entry). Training is RLlib's own loop (``algo.train()``, its
env runners as Ray actors); after each iteration that passed a multiple of --eval-every env steps the learner's
module acts greedily in greedy_eval's 10 seeded episodes. Last stdout line: the run's JSON object.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: run by another venv's python

from bench.peers import greedy_eval  # noqa: E402  (numpy and gymnasium only)


def ppo_config(env_id: str) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    config = PPOConfig().environment(env_id)
    if env_id == "CartPole-v1":  # rllib/tuned_examples/ppo/cartpole_ppo.py
        return (config.rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                                 vf_share_layers=True))
                .training(gamma=0.99, lr=3e-4, num_epochs=6, vf_loss_coeff=0.01, use_kl_loss=True))
    # the zoo's LunarLander PPO: 16 envs x 1024 steps a rollout, minibatches of 64, 4 epochs, gae 0.98,
    # gamma 0.999, entropy 0.01; SB3's defaults otherwise (lr 3e-4, clip 0.2, 64x64 tanh, no KL term)
    return (config.env_runners(num_env_runners=2, num_envs_per_env_runner=8)
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh"))
            .training(train_batch_size_per_learner=16 * 1024, minibatch_size=64, num_epochs=4, lambda_=0.98,
                      gamma=0.999, entropy_coeff=0.01, lr=3e-4, clip_param=0.2, use_kl_loss=False,
                      vf_clip_param=float("inf"), grad_clip=0.5))


def dqn_config(env_id: str) -> Any:
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    config = DQNConfig().environment(env_id)
    if env_id == "CartPole-v1":  # rllib/tuned_examples/dqn/cartpole_dqn.py
        return (config.training(lr=5e-4, train_batch_size_per_learner=32,
                                replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 50000,
                                                      "alpha": 0.6, "beta": 0.4},
                                n_step=(2, 5), double_q=True, dueling=True, epsilon=[(0, 1.0), (10000, 0.02)])
                .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[256], fcnet_activation="tanh",
                                                           fcnet_bias_initializer="zeros_",
                                                           head_fcnet_bias_initializer="zeros_",
                                                           head_fcnet_hiddens=[256])))
    # the zoo's LunarLander DQN: lr 6.3e-4, batch 128, buffer 50k, target every 250, train every 4 steps,
    # epsilon 1 -> 0.1 over 12% of 100k steps, 256x256
    return (config.training(lr=6.3e-4, train_batch_size_per_learner=128, gamma=0.99,
                            replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 50000},
                            target_network_update_freq=250, n_step=1, double_q=True, dueling=False,
                            epsilon=[(0, 1.0), (12_000, 0.1)], training_intensity=128 / 4)
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[256, 256], fcnet_activation="relu")))


def greedy_policy(algo: Any) -> greedy_eval.GreedyPolicy:
    """The learner's current module, acting greedily (argmax of its logits or Q-values)."""
    import numpy as np
    import torch
    from ray.rllib.core.columns import Columns

    module = algo.get_module()

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = module.forward_inference({Columns.OBS: torch.from_numpy(obs)})
        if Columns.ACTIONS in out:
            return np.asarray(out[Columns.ACTIONS])
        return out[Columns.ACTION_DIST_INPUTS].argmax(-1).numpy()

    return act


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algo", choices=["PPO", "DQN"], required=True)
    ap.add_argument("--env", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--budget", type=int, required=True, help="env steps")
    ap.add_argument("--eval-every", type=int, required=True, help="env steps between greedy evaluations")
    ap.add_argument("--target", type=float, default=None, help="stop at the first evaluation at or above it")
    ap.add_argument("--start-epoch", type=float, default=None, help="the clock's start (default: now)")
    args = ap.parse_args()
    start = args.start_epoch or time.time()

    import ray
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    config = (ppo_config if args.algo == "PPO" else dqn_config)(args.env).debugging(seed=args.seed)
    algo = config.build_algo()
    evals = greedy_eval.Evaluations(args.env, args.seed, args.eval_every, args.target, start, args.budget)
    steps = 0
    while steps < args.budget:
        result = algo.train()
        steps = int(result[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED_LIFETIME])
        print(f"{args.algo} {args.env} seed {args.seed}: {steps} env steps at {time.time() - start:.1f} s",
              file=sys.stderr, flush=True)
        if evals.due(steps) and evals.evaluate(greedy_policy(algo), steps):
            break
    out = evals.result(steps, algo=args.algo, env=args.env, budget=args.budget)
    algo.stop()
    ray.shutdown()
    greedy_eval.print_result(out)


if __name__ == "__main__":
    main()
