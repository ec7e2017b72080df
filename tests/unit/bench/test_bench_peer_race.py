"""bench.learning.time_to_solve --peer: the race's JSON blocks and ratio rules, the --peer names, the runners'
result lines and their evaluation against rlfleet's own (none of it needs the peers' venvs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.learning.race import race_blocks, ratio, side_block
from bench.peers import greedy_eval
from bench.peers.venv_peers import PeerError, check_peer, last_json, parse_peers, run_pixels_peer
from rlfleet.common import config as config_mod
from rlfleet.common import evaluation

ROOT = Path(__file__).resolve().parents[3]


def run(wall: float, solved: bool = True, steps: int = 10_000) -> dict[str, Any]:
    return {"solved": solved, "wall_s": wall, "env_steps": steps}


def test_rlfleet_counts_its_solved_runs_and_a_peer_every_run_at_its_budget() -> None:
    ours = [run(10.0), run(30.0), run(500.0, solved=False)]
    rllib = [run(100.0), run(900.0, solved=False), run(900.0, solved=False)]
    out = race_blocks(ours, {"rllib": rllib, "sample-factory": [run(40.0), run(60.0)]})
    assert out["rlfleet"]["median_wall_s"] == 20.0 and out["rlfleet"]["solved"] == 2 and out["rlfleet"]["runs"] == 3
    assert out["rllib"]["median_wall_s"] == 900.0 and out["rllib"]["solved"] == 1
    assert out["ratio_rllib"] == round(20.0 / 900.0, 3) and out["ratio_rllib_unsolved"] == 2
    assert out["ratio_sample_factory"] == round(20.0 / 50.0, 3) and out["ratio_sample_factory_unsolved"] == 0
    assert out["rllib"]["env_steps_per_s"] == round(10_000 / 900.0, 1)
    assert {"solved", "runs", "median_wall_s", "env_steps_per_s"} <= set(out["sample_factory"])


def test_no_ratio_where_rlfleet_solved_nothing() -> None:
    assert ratio([run(50.0, solved=False)], [run(10.0)]) is None
    assert side_block([run(50.0, solved=False), run(70.0, solved=False)], over_solved=True)["median_wall_s"] == 60.0
    with pytest.raises(ValueError, match="at least one run"):
        side_block([], over_solved=False)


def test_peer_names_are_checked_and_kept_in_order() -> None:
    assert parse_peers("rllib, sb3,rllib") == ["rllib", "sb3"]
    with pytest.raises(ValueError, match="unknown peer cleanrl; allowed: sb3, sample-factory, rllib"):
        parse_peers("sb3,cleanrl")


def test_a_peer_without_its_venv_or_the_algorithm_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(PeerError, match="run `make peers` first"):
        check_peer("rllib", "dqn", peers_dir=tmp_path)
    with pytest.raises(PeerError, match="sample-factory races --algo ppo, not sac"):
        check_peer("sample-factory", "sac", peers_dir=tmp_path)


def test_the_pixels_race_refuses_before_any_run_without_sample_factorys_venv(tmp_path: Path) -> None:
    with pytest.raises(PeerError, match="make peers"):
        run_pixels_peer(1, 5.0, peers_dir=tmp_path)
    with pytest.raises(PeerError, match="make peers"):
        run_pixels_peer(1, 5.0, envs_per_worker=8, peers_dir=tmp_path)


def test_the_result_is_the_last_json_object_printed() -> None:
    out = 'ray: starting\n{"seed": 0, "solved": true}\n[1, 2]\nlog {not json\n'
    assert last_json(out) == {"seed": 0, "solved": True}
    assert last_json("no result here\n") is None


class PoleLeaner:
    """A fixed greedy policy (push toward the pole's lean): episodes of different lengths by seed."""

    def act(self, obs: np.ndarray, deterministic: bool = True) -> tuple[np.ndarray, dict[str, Any]]:
        return self(obs), {}

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return (obs[:, 2] > 0).astype(np.int64)


def test_the_peers_evaluation_scores_a_policy_as_rlfleets_evaluator_does() -> None:
    assert greedy_eval.EVAL_SEED_OFFSET == evaluation.EVAL_SEED_OFFSET
    cfg = config_mod.load(ROOT / "configs/cartpole-ppo.yaml", environ={})
    policy = PoleLeaner()
    theirs = greedy_eval.greedy_returns(policy, "CartPole-v1", seed=3)
    ours = evaluation.evaluate(policy, cfg, 10, seed=3 + evaluation.EVAL_SEED_OFFSET)
    assert np.array_equal(theirs, ours)
    assert len(set(ours.tolist())) > 1  # the seeds matter: a wrong offset would score other episodes


def test_evaluations_are_due_at_each_multiple_and_the_first_hit_counts() -> None:
    evals = greedy_eval.Evaluations("CartPole-v1", seed=0, every=1000, target=10.0, start_epoch=0.0)
    assert not evals.due(999) and evals.due(1003)
    assert evals.evaluate(PoleLeaner(), 1003)
    assert not evals.due(1999) and evals.due(2000)
    result = evals.result(5000)
    assert result["solved"] and result["env_steps"] == 1003 and result["evaluations"][0][0] == 1003


def test_weights_from_past_the_budget_do_not_solve() -> None:
    evals = greedy_eval.Evaluations("CartPole-v1", seed=0, every=1000, target=10.0, start_epoch=0.0, budget=1500)
    assert not evals.evaluate(PoleLeaner(), 2000)  # a peer that trained on while it evaluated
    result = evals.result(2600)
    assert not result["solved"] and result["env_steps"] == 1500 and result["evaluations"][0][2] >= 10.0
