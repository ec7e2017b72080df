"""SAC learner updates/s against Stable-Baselines3's SAC ``train()``, same sizes, same process.

    .venv/bin/python -m bench.learning.sac_updates [--env Pendulum-v1] [--batch 256] [--rounds 5] [--threads 1]

Both sides: 256x256 actor and critics (SB3's default MlpPolicy, our SAC default), batch 256,
automatic temperature, CPU with the same torch threads. Ours: ``SACLearner.learn`` on batches
already sampled (what the learner service hands it); SB3: ``model.train(gradient_steps=n)``
with its replay buffer filled with the same number of env transitions, so its own sampling is
included (that is part of SB3's update; ours samples in the replay service). Rounds alternate
between the two; the figure is the median round. Last line: one JSON object with
``"ratio"`` (ours / SB3; goal >= 1.0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import gymnasium as gym
import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="Pendulum-v1")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--updates", type=int, default=300, help="updates per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from stable_baselines3 import SAC

    from rlfleet.common.algorithms.sac.config import SACConfig
    from rlfleet.common.algorithms.sac.learner import SACLearner

    env = gym.make(args.env, render_mode=None)
    ours = SACLearner(SACConfig(batch_size=args.batch), env.observation_space, env.action_space, device="cpu")
    theirs = SAC("MlpPolicy", env, batch_size=args.batch, learning_starts=0, device="cpu", seed=0, verbose=0)
    theirs.learn(total_timesteps=2_000)  # a filled buffer; 2k steps of 1 update each warm SB3 up too

    rng = np.random.default_rng(0)
    buf = theirs.replay_buffer
    assert buf is not None
    n = buf.size()
    batches = []
    for _ in range(16):  # ours samples in replay: hand it batches of the same transitions
        idx = rng.integers(0, n, args.batch)
        batches.append({"obs": buf.observations[idx, 0].reshape(args.batch, -1).astype(np.float32),
                        "action": theirs.policy.unscale_action(buf.actions[idx, 0]).astype(np.float32),
                        "reward": buf.rewards[idx, 0].astype(np.float32),
                        "next_obs": buf.next_observations[idx, 0].reshape(args.batch, -1).astype(np.float32),
                        "discount": (0.99 * (1.0 - buf.dones[idx, 0])).astype(np.float32)})
    for b in batches:
        ours.learn(b)

    ours_rates, theirs_rates = [], []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for i in range(args.updates):
            ours.learn(batches[i % len(batches)])
        ours_rates.append(args.updates / (time.perf_counter() - start))
        start = time.perf_counter()
        theirs.train(gradient_steps=args.updates, batch_size=args.batch)
        theirs_rates.append(args.updates / (time.perf_counter() - start))
        print("round", json.dumps({"ours": round(ours_rates[-1], 1), "sb3": round(theirs_rates[-1], 1)}), flush=True)
    ours_med, theirs_med = statistics.median(ours_rates), statistics.median(theirs_rates)
    print(json.dumps({"env": args.env, "batch": args.batch, "hidden": [256, 256], "torch_threads": args.threads,
                      "rounds": args.rounds, "updates_per_round": args.updates,
                      "ours_updates_per_s": round(ours_med, 1), "sb3_updates_per_s": round(theirs_med, 1),
                      "ratio": round(ours_med / theirs_med, 3)}))


if __name__ == "__main__":
    main()
