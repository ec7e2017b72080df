"""TensorBoard scalars: written into the run directory, read back; never fatal."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlfleet.common.tboard import ScalarWriter, read_scalars


def test_scalars_round_trip(tmp_path: Path) -> None:
    tb = ScalarWriter(tmp_path, "learner")
    assert tb.enabled
    for step in range(5):
        tb.add("learner/loss", 1.0 / (step + 1), step)
    tb.add("learner/loss", float("nan"), 99)  # skipped
    tb.add("learner/q_mean", None, 1)  # skipped
    tb.add_many({"learner/updates_per_s": 120.0}, step=4)
    tb.close()
    tb.add("learner/loss", 5.0, 100)  # after close: a no-op, not an error
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [s for s, _ in scalars["learner/loss"]] == [0, 1, 2, 3, 4]
    assert scalars["learner/loss"][1][1] == 0.5
    assert scalars["learner/updates_per_s"] == [(4, 120.0)]
    assert "learner/q_mean" not in scalars


def test_unwritable_run_dir_is_a_no_op(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the run directory should be")
    tb = ScalarWriter(blocker, "evaluator")
    assert not tb.enabled
    tb.add("eval/return", 1.0, 0)
    tb.flush()
    tb.close()


def test_an_actors_episodes_go_to_tensorboard_by_its_env_steps(tmp_path: Path) -> None:
    from rlfleet.common.metrics import ServiceMetrics
    from rlfleet.services.actor.episodes import Episodes

    episodes = Episodes(ServiceMetrics("actor"), 2, False, tmp_path / "episodes" / "actor-0.csv",
                        ScalarWriter(tmp_path, "actor-0"))
    episodes.RATE_EVERY_S = 0.0  # a rate at every step
    done, going = np.array([True, False]), np.array([False, False])
    episodes.step(2, 0, np.array([1.0, 1.0]), going, going)
    episodes.step(4, 0, np.array([2.0, 1.0]), done, going)  # slot 0 ends with 3
    episodes.step(6, 1, np.array([0.5, 4.0]), going, done[::-1])  # slot 1 ends with 6
    episodes.close()
    scalars = read_scalars(tmp_path / "tensorboard")
    assert scalars["actor/episode_return"] == [(4, 3.0), (6, 6.0)]
    rates = scalars["actor/env_steps_per_s"]
    assert [s for s, _ in rates] == [2, 4, 6] and all(r > 0 for _, r in rates)
