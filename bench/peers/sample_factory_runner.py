"""Sample Factory 2.1.1 APPO as a peer of bench.learning.time_to_solve: run by .peers/sample-factory's python.

    .peers/sample-factory/bin/python bench/peers/sample_factory_runner.py --algo APPO --env ENV --seed S
        --budget STEPS --eval-every STEPS [--target R] [--start-epoch T]

Sample Factory 2.1.1 needs gymnasium 0.29, which has LunarLander-v2 and not v3: --env LunarLander-v3 runs v2,
the same task for this race (v3 fixed determinism and a wind bug that do not change what it takes to land).
Training is Sample Factory's parallel runner (rollout workers, a policy worker and the learner as processes,
async); its settings: its own tuned example where one exists (sf_examples/train_gym_env.py: CartPole-v1),
otherwise the rl-baselines3-zoo's PPO hyperparameters mapped onto its arguments (LunarLander). Each time the
learner's env steps pass a multiple of --eval-every, this process asks the learner for a checkpoint
(Runner.save_periodic), loads it into a copy of the actor-critic and acts greedily (the argmax action, as
Sample Factory's --eval_deterministic) in greedy_eval's 10 seeded episodes; sampling and learning go on in
their processes meanwhile. Last stdout line: the run's JSON object.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: run by another venv's python

from bench.peers import greedy_eval  # noqa: E402  (numpy and gymnasium only)

ENV_IDS = {"LunarLander-v3": "LunarLander-v2"}  # gymnasium 0.29's id of the same task
CORES = len(os.sched_getaffinity(0))

# sf_examples/train_gym_env.py's command line for CartPole-v1 (its tuned example for gym envs)
CARTPOLE = ["--use_rnn=False", "--num_envs_per_worker=20", "--policy_workers_per_policy=2", "--recurrence=1",
            "--with_vtrace=False", "--batch_size=512", "--reward_scale=0.1"]
# the zoo's LunarLander PPO on Sample Factory's names: 16 envs (a worker per core), 1024 steps an env a batch, 4
# epochs of minibatches of 64 over each 16k-sample batch, gamma 0.999, lambda 0.98, entropy 0.01, lr 3e-4,
# clip 0.2, grad norm 0.5, a 64x64 tanh MLP, no input or return normalisation, no RNN, no V-trace. Sample
# Factory keeps a rollout whole within a minibatch: with the zoo's 1024 steps a rollout and minibatches of 64
# its learner skipped every batch as invalid data (0 frames trained in 13 minutes), so its rollouts are 64
# steps (GAE bootstrapped from the value at each rollout's end), the same 16k samples a batch. No cutoff of
# policy lag, as in the zoo's PPO (Sample Factory counts lag in SGD steps: 1,024 a batch here).
LUNARLANDER = ["--use_rnn=False", "--max_policy_lag=1000000", "--recurrence=1", "--with_vtrace=False",
               f"--num_workers={CORES}", f"--num_envs_per_worker={16 // CORES}", "--rollout=64", "--batch_size=64",
               "--num_batches_per_epoch=256", "--num_epochs=4", "--gamma=0.999", "--gae_lambda=0.98",
               "--exploration_loss_coeff=0.01", "--learning_rate=0.0003", "--ppo_clip_ratio=0.2",
               "--max_grad_norm=0.5", "--value_loss_coeff=0.5", "--encoder_mlp_layers", "64", "64",
               "--nonlinearity=tanh", "--normalize_input=False", "--normalize_returns=False", "--reward_scale=1.0"]


def make_env(full_env_name: str, cfg: Any = None, env_config: Any = None, render_mode: str | None = None) -> Any:
    """Sample Factory's env function (module level: its worker processes are spawned and unpickle it)."""
    import gymnasium as gym

    return gym.make(full_env_name, render_mode=None)


def checkpoints(cfg: Any) -> list[tuple[int, str]]:
    """(env steps, path) of the learner's checkpoints (checkpoint_<train step>_<env steps>.pth)."""
    from sample_factory.utils.utils import experiment_dir

    found = []
    for path in glob.glob(os.path.join(experiment_dir(cfg=cfg), "checkpoint_p0", "checkpoint_*.pth")):
        found.append((int(Path(path).stem.rsplit("_", 1)[1]), path))
    return sorted(found)


def make_observer(evals: greedy_eval.Evaluations, env_id: str) -> Any:
    import numpy as np
    import torch
    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.action_distributions import argmax_actions
    from sample_factory.algo.utils.rl_utils import prepare_and_normalize_obs
    from sample_factory.model.actor_critic import create_actor_critic
    from sample_factory.model.model_utils import get_rnn_size

    class GreedyEvaluations(AlgoObserver):  # type: ignore[misc]
        """Asks for a checkpoint when the env steps pass a multiple of the interval; evaluates it once written."""

        def __init__(self) -> None:
            self.asked_at: int | None = None
            self.model: Any = None

        def on_training_step(self, runner: Any, training_iteration_since_resume: int) -> None:
            steps = int(runner.env_steps.get(0, 0))
            if self.asked_at is None:
                if evals.budget is not None and steps >= evals.budget:
                    runner._stop_training()  # its own check waits for the steps to pass the budget
                elif evals.due(steps):
                    self.asked_at = steps
                    runner.save_periodic.emit()
                return
            written = [(s, p) for s, p in checkpoints(runner.cfg) if s >= self.asked_at]
            if not written:
                return
            self.asked_at = None
            at, path = written[-1]
            if evals.evaluate(self.policy(runner, path), at):
                runner._stop_training()

        def policy(self, runner: Any, path: str) -> greedy_eval.GreedyPolicy:
            if self.model is None:
                info = runner.env_info
                self.model = create_actor_critic(runner.cfg, info.obs_space, info.action_space)
                self.model.eval()
            self.model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True)["model"])
            rnn = get_rnn_size(runner.cfg)

            def act(obs: np.ndarray) -> np.ndarray:
                with torch.no_grad():
                    normalized = prepare_and_normalize_obs(self.model, {"obs": torch.from_numpy(obs)})
                    self.model(normalized, torch.zeros([len(obs), rnn]))
                    return argmax_actions(self.model.action_distribution()).reshape(-1).numpy()

            return act

    return GreedyEvaluations()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algo", choices=["APPO"], default="APPO")
    ap.add_argument("--env", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--budget", type=int, required=True, help="env steps")
    ap.add_argument("--eval-every", type=int, required=True, help="env steps between greedy evaluations")
    ap.add_argument("--target", type=float, default=None, help="stop at the first evaluation at or above it")
    ap.add_argument("--start-epoch", type=float, default=None, help="the clock's start (default: now)")
    args = ap.parse_args()
    start = args.start_epoch or time.time()
    env_id = ENV_IDS.get(args.env, args.env)

    from sample_factory.algo.utils.misc import ExperimentStatus
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner

    register_env(env_id, make_env)
    train_dir = tempfile.mkdtemp(prefix="sf-peer-")
    argv = [f"--env={env_id}", "--algo=APPO", f"--seed={args.seed}", f"--train_for_env_steps={args.budget}",
            f"--train_dir={train_dir}", "--experiment=peer", "--device=cpu", "--save_every_sec=1000000",
            "--save_best_every_sec=1000000", "--keep_checkpoints=2", "--experiment_summaries_interval=1000000",
            "--restart_behavior=overwrite", *(CARTPOLE if env_id == "CartPole-v1" else LUNARLANDER)]
    parser, _ = parse_sf_args(argv=argv)
    cfg = parse_full_cfg(parser, argv)
    cfg, runner = make_runner(cfg)
    evals = greedy_eval.Evaluations(env_id, args.seed, args.eval_every, args.target, start, args.budget)
    runner.register_observer(make_observer(evals, env_id))
    status = runner.init()
    if status == ExperimentStatus.SUCCESS:
        status = runner.run()
    steps = int(runner.env_steps.get(0, 0))
    # sample_factory_status: Sample Factory's ExperimentStatus; 2.1.1 reports a failure (1) after a finished run
    # when its all_components_stopped fires twice at shutdown, which costs nothing measured here
    greedy_eval.print_result(evals.result(steps, algo="APPO", env=env_id, budget=args.budget,
                                          sample_factory_status=int(status)))


if __name__ == "__main__":
    main()
