"""`rlfleet.load_policy` and `rlfleet.evaluate`: a run's acting policy, and its greedy score.

The policy is the one the evaluator builds (:func:`rlfleet.common.envs.acting_policy`) with the weights of the
learner's checkpoint, read as `rlfleet eval` reads them; its score is the evaluator's
(:func:`rlfleet.common.evaluation.evaluate`: deterministic episodes, one seed each).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.cli.evaluate import CheckpointError, load_any, make_policy, run_weights
from rlfleet.common.config import Experiment
from rlfleet.runs import Run


@dataclass
class Policy:
    """A run's acting policy: :meth:`predict` maps observations to actions."""

    cfg: Experiment
    version: int  # the weights version the checkpoint holds
    checkpoint: Path
    obs_shape: tuple[int, ...]  # one observation's, as the env gives it
    acting: Any  # the algorithm's acting policy (common.algorithms.Policy)

    def predict(self, obs: Any, deterministic: bool = True) -> np.ndarray:
        """Actions for one observation (shaped as the env's) or a batch of them (one more leading axis).

        ``deterministic``: the greedy (or mean) action, as the evaluator acts; False samples as an actor."""
        x = np.asarray(obs)
        single = x.shape == self.obs_shape
        if not single and x.shape[1:] != self.obs_shape:
            raise ValueError(f"observation of shape {x.shape}: allowed: {self.obs_shape} (one) or "
                             f"(N, {', '.join(map(str, self.obs_shape))}) (a batch)")
        actions = self.acting.act(x[None] if single else x, deterministic=deterministic)[0]
        return np.asarray(actions)[0] if single else np.asarray(actions)


@dataclass(frozen=True)
class Score:
    """The returns of an evaluation: one per episode, seeds seed..seed+episodes-1."""

    returns: np.ndarray
    seed: int

    @property
    def mean(self) -> float:
        return float(self.returns.mean())

    @property
    def std(self) -> float:
        return float(self.returns.std())


def checkpoint_of(run_or_checkpoint: Run | str | Path) -> Path:
    """The weights file of a run (a Run or a run directory: its best evaluation's weights, else its latest,
    as `rlfleet eval RUN_DIR` picks) or the checkpoint file itself."""
    path = run_or_checkpoint.run_dir if isinstance(run_or_checkpoint, Run) else Path(run_or_checkpoint)
    return run_weights(path)[0] if path.is_dir() else path


def load_policy(run_or_checkpoint: Run | str | Path) -> Policy:
    """The acting policy of a run (a :class:`Run`, its directory) or of a checkpoint file (a learner's,
    RUN_DIR/evaluator/best.pt or a paramserver shard's .npz).

    CheckpointError (a ValueError) names the file when there is none or it is not a checkpoint."""
    path = checkpoint_of(run_or_checkpoint)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file (a run's weights are RUN_DIR/evaluator/best.pt, "
                              "RUN_DIR/learner/checkpoint.pt or RUN_DIR/paramserver/shard-N.npz)")
    from rlfleet.common.envs import probe_env

    loaded = load_any(path)
    obs_space, _ = probe_env(loaded.cfg)
    return Policy(loaded.cfg, loaded.version, path, tuple(obs_space.shape or ()),
                  make_policy(loaded.cfg, loaded.weights))


def evaluate(run_or_policy: Policy | Run | str | Path, episodes: int = 10, seed: int | None = None) -> Score:
    """Mean and spread of ``episodes`` deterministic episodes, as the evaluator scores them; ``seed``: the
    first episode's (default: the evaluator's, the experiment seed + EVAL_SEED_OFFSET)."""
    from rlfleet.common.evaluation import EVAL_SEED_OFFSET
    from rlfleet.common.evaluation import evaluate as evaluate_policy

    if episodes < 1:
        raise ValueError(f"episodes={episodes}: allowed: 1 or more")
    policy = run_or_policy if isinstance(run_or_policy, Policy) else load_policy(run_or_policy)
    seed = policy.cfg.seed + EVAL_SEED_OFFSET if seed is None else seed
    return Score(evaluate_policy(policy.acting, policy.cfg, episodes, seed), seed)
