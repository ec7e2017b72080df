"""TensorBoard scalars: written into the run directory, read back; never fatal."""

from __future__ import annotations

from pathlib import Path

from common.tboard import ScalarWriter, read_scalars


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
