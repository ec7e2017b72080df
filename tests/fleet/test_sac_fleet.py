"""SAC through the whole fleet over real processes: a continuous task with asymmetric action
bounds learnt (the env raises on an action outside its Box, so one stray action fails the run),
every shipped config run briefly, and a learner stopped and restarted mid-run that goes on from its
checkpoint with all three optimizers and the temperature.

LopsidedReach: random about -12; SAC by hand reached -1.4 at 9.9k env steps in 4 s (2 actors x 2
envs); the budget of 60k leaves room without letting a broken learner through.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml

from harness.fleet_helpers import CONFIGS, only_run_dir, read_csv, rlfleet, wait_for
from rlfleet.cli.fleetview import scrape
from rlfleet.cli.launcher import Fleet, make_run_dir, plan
from rlfleet.common import config as config_mod
from rlfleet.common.algorithms.checkpoint import load_checkpoint

pytestmark = pytest.mark.e2e

REACH = {
    "name": "reach-sac", "seed": 0, "sync": "async",
    "env": {"id": "harness.toy_envs:LopsidedReach", "num_envs": 2},
    "algorithm": {"name": "sac", "hidden": [64, 64], "lr": 1e-3, "batch_size": 64, "gamma": 0.9,
                  "learning_starts": 200},
    "actor": {"insert_batch": 8, "poll_every": 20},
    "evaluator": {"episodes": 10, "every_steps": 1000},
    "replay": {"shards": 1, "durability": "memory",
               "tables": [{"name": "main", "kind": "prioritized", "capacity": 100000, "min_size": 200,
                           "samples_per_insert": 16}]},
    "learner": {"publish_every": 10, "samples_in_flight": 2},
}


def reach_config(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "reach-sac.yaml"
    path.write_text(yaml.safe_dump({**REACH, **changes}))
    return path


@pytest.mark.parametrize("sync", ["async", "barrier"])
def test_sac_learns_lopsided_reach_within_its_bounds(tmp_path: Path, sync: str) -> None:
    barrier = {  # rounds of 2 actors x 2 envs x 100 steps, 100 updates each; the round fixes the ratio
        "actor": {"insert_batch": 8, "poll_every": 20, "steps_per_round": 100},
        "learner": {"updates_per_round": 100, "samples_in_flight": 2},
        "replay": {**REACH["replay"], "tables": [{"name": "main", "kind": "uniform", "capacity": 100000,  # type: ignore[dict-item]
                                                  "min_size": 200}]},
    }
    config = reach_config(tmp_path, sync=sync, **(barrier if sync == "barrier" else {}))
    proc = rlfleet("up", "--config", str(config), "--actors", "2", "--until-return=-1.5", "--max-env-steps",
                   "60000", "--max-seconds", "240", "--runs", str(tmp_path / "runs"), timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}"
    assert "target reached" in proc.stdout
    run_dir = only_run_dir(tmp_path / "runs")
    best = max(read_csv(run_dir / "evaluations.csv"), key=lambda r: float(r["mean_return"]))
    assert float(best["mean_return"]) >= -1.5 and int(best["version"]) > 0, best
    state = load_checkpoint(run_dir / "learner" / "checkpoint.pt")
    assert state is not None
    assert all(key.startswith("actor.") for key in state["weights"]), sorted(state["weights"])  # only the actor


# pendulum in make test; the heavier configs (40-80 s each) in make test-slow
@pytest.mark.parametrize("name", ["pendulum", *(pytest.param(n, marks=pytest.mark.slow) for n in (
    "lunarlandercontinuous", "mountaincarcontinuous", "bipedalwalker", "hopper"))])
def test_shipped_configs_run(tmp_path: Path, name: str) -> None:
    """Each shipped SAC config runs through every service, past its warm-up, and the learner updates
    (no target: a smoke run; the warm-up and the table's min_size shortened to reach learning)."""
    proc = rlfleet("up", "--config", str(CONFIGS / f"{name}-sac.yaml"), "--actors", "1", "--max-env-steps", "1500",
                   "--max-seconds", "120", "--runs", str(tmp_path), "--set", "algorithm.learning_starts=300",
                   "--set", "replay.tables.0.min_size=300", timeout=200)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}"
    run_dir = only_run_dir(tmp_path)
    progress = read_csv(run_dir / "progress.csv")
    assert int(progress[-1]["updates"]) > 100, progress[-1]
    if name == "pendulum":  # eval --video and report read a SAC run as any other
        gif = tmp_path / "sac.gif"
        res = rlfleet("eval", "--checkpoint", str(run_dir / "learner" / "checkpoint.pt"), "--video", str(gif),
                      timeout=300)
        assert res.returncode == 0 and "Pendulum-v1, sac" in res.stdout, res.stdout[-3000:]
        assert gif.read_bytes()[:3] == b"GIF"
        res = rlfleet("report", str(run_dir), "--out", str(tmp_path / "report"), timeout=120)
        assert res.returncode == 0 and (tmp_path / "report" / "report.md").exists(), res.stdout[-3000:]


def test_sac_learner_resumes_with_its_optimizers_and_temperature(tmp_path: Path) -> None:
    cfg = config_mod.load(reach_config(tmp_path), environ={}, sets=["evaluator.enabled=false"])
    run_dir = make_run_dir(cfg, str(tmp_path))
    cfg, members = plan(cfg, 1, run_dir, inproc=False)
    fleet = Fleet(cfg, members, run_dir, inproc=False)
    learner = next(m for m in members if m.name == "learner")

    def updates() -> float:
        return scrape(learner.url).samples.get("rlfleet_learner_updates_total", 0.0)

    try:
        fleet.start()
        fleet.wait_healthy(120)
        wait_for(lambda: updates() >= 400, 180, "400 learner updates")
        assert learner.proc is not None
        learner.proc.send_signal(signal.SIGTERM)
        assert learner.proc.wait(60) == 0
        state = load_checkpoint(run_dir / "learner" / "checkpoint.pt")
        assert state is not None
        algo = state["core"]
        stopped_at = int(algo["num_updates"])
        assert stopped_at >= 400
        assert set(algo["optimizers"]) == {"critic", "actor", "alpha"}
        assert all(int(s["state"][0]["step"]) == stopped_at for s in algo["optimizers"].values())
        assert algo["log_alpha"] < 0.0  # the temperature has fallen from its start of 1

        fleet._start_process(learner)  # the launcher's own command
        back = wait_for(lambda: (u := updates()) > 0 and u, 120, "the learner to come back")
        assert back >= stopped_at, (back, stopped_at)
        wait_for(lambda: updates() >= stopped_at + 200, 120, "updates to go on after the restart")
        assert "resumed from" in (run_dir / "logs" / "learner.log").read_text()
    finally:
        fleet.stop()
