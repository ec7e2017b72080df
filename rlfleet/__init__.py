"""rlfleet from Python: train a fleet (or the serial runner), get the run back, load and score its policy.

    import rlfleet
    run = rlfleet.train("configs/cartpole-dqn.yaml", until_return=475, max_env_steps=60_000)
    policy = rlfleet.load_policy(run)
    action = policy.predict(obs)
    print(rlfleet.evaluate(policy, episodes=10).mean)

docs/python_api.md describes each call.
"""

from __future__ import annotations

from rlfleet.policy import Policy, Score, evaluate, load_policy
from rlfleet.runs import Evaluation, Run, read_run
from rlfleet.training import TrainError, train

__all__ = ["Evaluation", "Policy", "Run", "Score", "TrainError", "evaluate", "load_policy", "read_run", "train"]
