"""Several learners (`learners: N`): real learner processes meet at the rendezvous, form a gloo group,
train CartPole together (each on half of every batch, gradients averaged), rank 0 publishes and
checkpoints; a lost rank stops the other with an error naming the group's address, not a hang;
configs that cannot work are refused before anything starts."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from common import config as config_mod
from tests.fleet_helpers import CONFIGS, only_run_dir, rlfleet


def test_configs_that_cannot_split_are_refused() -> None:
    cases = [
        (["learners=3"], "algorithm.batch_size=256 with learners=3"),
        (["learners=0"], "learners"),
        (["learners=2", "sync=barrier"], "async mode only"),
        (["learners=2", "learner.rendezvous=localhost"], "learner.rendezvous"),
    ]
    for sets, message in cases:
        with pytest.raises(config_mod.ConfigError, match=re.escape(message)):
            config_mod.load(CONFIGS / "cartpole-dqn.yaml", sets=sets, environ={})
    ppo = config_mod.load(CONFIGS / "cartpole-ppo.yaml", sets=["sync=async"], environ={})
    with pytest.raises(config_mod.ConfigError, match="algorithm.batch_segments"):
        odd = ppo.algorithm.batch_segments + 1
        config_mod.load(CONFIGS / "cartpole-ppo.yaml", sets=["sync=async", f"learners={odd}"], environ={})


def test_nccl_without_cuda_is_refused_at_start() -> None:
    import torch

    from common.runtime import StartupError
    from services.learner.ranks import backend

    cfg = config_mod.load(CONFIGS / "cartpole-dqn.yaml", sets=["learners=2", "learner.backend=nccl"], environ={})
    with pytest.raises(StartupError, match="learner.backend=nccl needs CUDA"):
        backend(cfg, torch.device("cpu"))


@pytest.mark.e2e
def test_two_learners_solve_cartpole_together(tmp_path: Path) -> None:
    proc = rlfleet("up", "--config", str(CONFIGS / "cartpole-dqn.yaml"), "--actors", "2", "--learners", "2",
                   "--until-return", "475", "--max-env-steps", "300000", "--max-seconds", "600",
                   "--runs", str(tmp_path))
    run_dir = only_run_dir(tmp_path)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}"
    logs = {name: (run_dir / "logs" / f"{name}.log").read_text() for name in ("learner", "learner-1")}
    joined = "\n".join(logs.values())
    assert "rank 0 of 2" in joined and "rank 1 of 2" in joined and "hosting the rendezvous" in joined
    publisher = next(text for text in logs.values() if "rank 0 of 2" in text)
    follower = next(text for text in logs.values() if "rank 1 of 2" in text)
    assert "checkpoint at update" in publisher and "checkpoint at update" not in follower
    assert "rank 0 publishes and checkpoints" in follower
    assert "Traceback" not in joined


@pytest.mark.chaos
def test_a_lost_rank_stops_the_other_and_the_restarted_group_goes_on(tmp_path: Path) -> None:
    """kill -9 of one rank: the other stops within the collective timeout with an error naming the
    group's address (no hang); both restarted (what compose's restart policy does), they form the
    group again, resume from rank 0's checkpoint and train on: updates and versions go on."""
    from cli.fleetview import scrape
    from tests.chaos_helpers import kill9, member, start_fleet
    from tests.fleet_helpers import wait_for

    fleet, _ = start_fleet(CONFIGS / "cartpole-dqn.yaml", tmp_path, 1,
                           ["learners=2", "learner.collective_timeout_s=10", "evaluator.enabled=false",
                            "learner.checkpoint_every_s=1"])
    try:
        ranks = [member(fleet, "learner"), member(fleet, "learner-1")]

        def logs() -> str:
            return "".join(m.log_path.read_text() for m in ranks if m.log_path is not None)

        wait_for(lambda: "trains on its share" in logs(), 60, "both ranks training")
        time.sleep(2.0)
        follower = next(m for m in ranks if m.log_path is not None and "trains on its share" in m.log_path.read_text())
        survivor = next(m for m in ranks if m is not follower)
        kill9(follower)
        t0 = time.monotonic()
        wait_for(lambda: survivor.exit_code() is not None, 60, "the surviving rank to stop")
        assert time.monotonic() - t0 < 30
        assert survivor.log_path is not None
        log = survivor.log_path.read_text()
        assert "lost a rank" in log and "tcp://127.0.0.1:" in log and "restart every learner" in log, log[-2000:]
        assert survivor.exit_code() != 0
        version = scrape(member(fleet, "paramserver-0").url).samples.get("rlfleet_paramserver_version", -1.0)
        for m in ranks:
            fleet.restart(m)
        wait_for(lambda: all(scrape(m.url, health_only=True).healthy for m in ranks), 120, "both ranks back")
        wait_for(lambda: min(scrape(m.url).samples.get("rlfleet_learner_updates_total", 0.0) for m in ranks)
                 > 200, 120, "the group to train again")
        log = "".join(m.log_path.read_text() for m in ranks if m.log_path is not None)
        assert log.count("resumed from") >= 1 and log.count("rank 0 of 2 at tcp") == 2, log[-3000:]
        assert scrape(member(fleet, "paramserver-0").url).samples.get("rlfleet_paramserver_version", -1.0) > version
    finally:
        fleet.stop()
