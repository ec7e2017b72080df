"""bench.device on CPU: its JSON's keys, CPU figures that are numbers, CUDA parts that say they were skipped,
and the comparisons it runs across devices, run here between two CPU learners (no GPU on CI).

The bench's whole ``--cpu`` run (fleets included) and a GPU machine's run are in docs/operations.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.fleet import device


@pytest.fixture(scope="module")
def dqn_mlp() -> tuple[object, dict[str, np.ndarray]]:
    cfg = device.network_config("dqn_mlp", short=True, float32=True)
    learner = device.make_learner(cfg, "cpu")
    return cfg, device.items(cfg, learner.data.batch_items * 4)


def test_cpu_run_reports_cpu_numbers_and_skips_cuda_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    got = device.main(["--cpu", "--only", "updates,weights,checkpoint", "--networks", "dqn_mlp",
                       "--update-seconds", "0.3"])
    assert got["bench"] == "device" and got["mode"] == "cpu"
    assert {"updates", "weights", "checkpoint", "torch", "torch_cuda", "cuda_available", "cores"} <= set(got)
    row = got["updates"]["dqn_mlp"]
    assert isinstance(row["cpu"], float) and row["cpu"] > 0
    assert row["cuda"] == row["cuda_over_cpu"] == device.SKIPPED == "skipped: no CUDA"
    assert got["weights"] == {"dqn_mlp": device.SKIPPED} and got["checkpoint"] == {"dqn_mlp": device.SKIPPED}
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("{") and '"bench": "device"' in last  # one JSON line, last


def test_an_unknown_part_or_network_is_refused_naming_the_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        device.main(["--cpu", "--only", "updates,gpu"])
    assert "unknown part(s) gpu" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        device.main(["--cpu", "--networks", "resnet"])
    err = capsys.readouterr().err
    assert "--networks resnet" in err and "dqn_nature_cnn" in err


def test_same_seed_same_batches_give_the_same_weights(dqn_mlp: tuple[object, dict[str, np.ndarray]]) -> None:
    cfg, data = dqn_mlp
    got = device.same_updates(cfg, data, "cpu", "cpu")
    assert got == {"max_abs_diff": 0.0, "max_abs_diff_before": 0.0}
    learner = device.make_learner(cfg, "cpu")
    before = learner.weights()
    for batch in device.batches(learner, data, 3, seed=1):
        device.learn(learner, batch)
    assert device.max_abs_diff(before, learner.weights()) > 0  # the three updates moved the weights


@pytest.mark.parametrize("name", ["dqn_mlp", "sac_mlp"])
def test_a_checkpoint_resumes_in_a_learner_of_another_seed(name: str, tmp_path: Path) -> None:
    cfg = device.network_config(name, short=True, float32=True)
    data = device.items(cfg, device.make_learner(cfg, "cpu").data.batch_items * 2)
    got = device.resumed_on(cfg, data, "cpu", "cpu", tmp_path)
    assert got == {"resumed": True, "max_abs_diff": 0.0, "updates": 2}

