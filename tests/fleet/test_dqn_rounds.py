"""DQN's barrier rounds through a real fleet repeat to the bit with one actor, as docs/configuration.md says.

With two or more actors they do not (their inserts land in replay in the order timing decides); PPO's
rounds do with any number (tests/fleet/test_ppo_rounds.py). The episodes of a one-actor run repeat too
(tests/fleet/test_e2e.py); this compares the weights the learner publishes at every version.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.ppo_fleet_helpers import Weights, follow_versions, ppo_fleet

pytestmark = pytest.mark.e2e

ROUNDS = 6


def one_actor_run(runs: Path) -> dict[int, Weights]:
    # learning from round 1 on (200 env steps a round, 300 to start), 40 updates a round: a few seconds a round
    with ppo_fleet(runs, 1, "seed=5", "replay.tables.0.min_size=300", "learner.updates_per_round=40",
                   config="cartpole-dqn-barrier.yaml", actors_before_learner=True) as (cfg, _fleet):
        return follow_versions(cfg, ROUNDS, timeout_s=300)


def test_one_actor_barrier_runs_publish_the_same_weights(tmp_path: Path) -> None:
    first, second = one_actor_run(tmp_path / "a"), one_actor_run(tmp_path / "b")
    assert ROUNDS in first and ROUNDS in second, (sorted(first), sorted(second))
    for version in sorted(set(first) & set(second)):
        for name, array in first[version].items():
            assert np.array_equal(array, second[version][name]), f"version {version}: {name} differs"
    assert any(not np.array_equal(first[1][n], first[ROUNDS][n]) for n in first[1])  # and it learnt
