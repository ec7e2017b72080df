"""bench.learning.suite's bookkeeping: which runs count, the table's cells and the curves' bands.

The runs are made up here; the suite's own runs (real fleets and SB3) are in docs/results/runs.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.learning.config_digest import settings_digest
from bench.learning.suite import (
    ROWS,
    SUITE,
    config_digest,
    current,
    curve_band,
    load_runs,
    row_runs,
    side_key,
    sides_of,
    summary,
    write_report,
)
from rlfleet.common import config as config_mod

ROOT = Path(__file__).resolve().parents[3]


def run(solved: bool, steps: int, wall: float, curve: list[list[float]]) -> dict[str, object]:
    return {"solved": solved, "env_steps": steps, "wall_s": wall, "best_return": max(c[2] for c in curve),
            "curve": curve}


def entry(key: str, seed: int, result: dict[str, object], date: str = "2026-11-27 10:00") -> str:
    """A run of cartpole-dqn (a side of it, or its peer's) as the config is now."""
    side = "sb3" if key.startswith("sb3-") else key.split(":")[0]
    return json.dumps({"key": key, "row": "cartpole-dqn", "side": side, "seed": seed, "cores": 2,
                       "date": date, "run": result, "config": config_digest(ROWS["cartpole-dqn"])})


def test_every_row_names_a_shipped_config_of_its_env() -> None:
    for row in SUITE:
        cfg = config_mod.load(ROOT / "configs" / row.config, environ={})
        assert cfg.env.id == row.env, row.name
        assert (row.target is None) == (row.max_seconds is not None), row.name


def test_rows_on_one_env_and_budget_share_their_peer_runs_and_keep_their_own() -> None:
    dppo, appo = ROWS["lunarlander-ppo"], ROWS["lunarlander-appo"]
    assert side_key(dppo, "sb3") == side_key(appo, "sb3")
    assert side_key(dppo, "fleet") != side_key(appo, "fleet")
    assert sides_of(ROWS["cartpole-dynaq"], ["fleet", "sb3", "serial"]) == ["fleet", "sb3"]  # planners: no serial run
    # a heavy row's peer runs to its wall budget: another budget is another set of runs
    heavy = ROWS["hopper-sac"]
    assert side_key(heavy, "sb3").endswith(f":{heavy.max_seconds:g}s")
    assert sides_of(ROWS["cartpole-a3c"], ["fleet", "serial"]) == ["fleet", "serial"]  # gradient workers run serially


def test_the_latest_run_of_a_seed_counts_and_medians_are_over_solved_runs(tmp_path: Path) -> None:
    row = ROWS["cartpole-dqn"]
    key = side_key(row, "fleet")
    lines = [entry(key, 0, run(False, 50_000, 60.0, [[5000, 5.0, 100.0]]), "2026-11-26 09:00"),
             entry(key, 0, run(True, 10_000, 8.0, [[5000, 5.0, 100.0], [10_000, 8.0, 480.0]])),
             entry(key, 1, run(True, 20_000, 12.0, [[10_000, 6.0, 200.0], [20_000, 12.0, 490.0]])),
             entry(key, 2, run(False, 50_000, 40.0, [[50_000, 40.0, 300.0]])),
             # a run of an older version of the config: not counted
             json.dumps({**json.loads(entry(key, 3, run(True, 5_000, 3.0, [[5000, 3.0, 500.0]]))), "config": "0ld"})]
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    runs = load_runs(path)
    assert len(runs) == 4 and runs[key, 0]["run"]["solved"]
    assert not current(row, runs[key, 3]) and current(row, runs[key, 2])
    figures = summary(row_runs(row, "fleet", runs))
    assert figures is not None
    assert (figures["solved"], figures["runs"]) == (2, 3)
    assert figures["median_env_steps"] == 15_000 and figures["median_wall_s"] == 10.0

    report = tmp_path / "results.md"
    shown = write_report(path, report)
    text = report.read_text()
    assert "| cartpole-dqn |" in text and "| 2/3 | 15.0k | 10.0 |" in text
    assert "lunarlander-ppo" not in text  # no runs: no row
    assert shown["cartpole-dqn"]["fleet"]["solved"] == 2
    assert (tmp_path / "results" / "CartPole-v1.png").read_bytes().startswith(b"\x89PNG")


def test_the_table_is_of_the_suites_seeds_and_the_algorithm_check_of_every_seed_both_ran(tmp_path: Path) -> None:
    row = ROWS["cartpole-dqn"]
    fleet, serial, peer = (side_key(row, side) for side in ("fleet", "serial", "sb3"))
    curve = [[5000, 5.0, 480.0]]
    lines = [entry(fleet, seed, run(True, 10_000, 8.0, curve)) for seed in range(5)]
    lines += [entry(serial, seed, run(True, 10_000 if seed < 5 else 40_000, 6.0, curve)) for seed in range(8)]
    lines += [entry(peer, seed, run(True, 20_000, 30.0, curve)) for seed in range(7)]  # seed 7: no peer run
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = tmp_path / "results.md"
    shown = write_report(path, report, range(5))
    assert shown["cartpole-dqn"]["serial"]["runs"] == 5 and shown["cartpole-dqn"]["sb3"]["runs"] == 5
    text = report.read_text()
    assert "| cartpole-dqn | 0-6 (7) | 7/7 | 10.0k | 7/7 | 20.0k | 0.50 |" in text  # seeds 5, 6 count here
    shown = write_report(path, report, range(5, 7))
    assert shown["cartpole-dqn"]["fleet"] is None  # no fleet run on seeds 5-6
    assert shown["cartpole-dqn"]["serial"]["median_env_steps"] == 40_000


def test_the_band_holds_a_solved_run_at_its_last_return_and_ends_an_unsolved_one() -> None:
    solved = [[1000, 1.0, -500.0], [2000, 2.0, -150.0]]
    unsolved = [[1000, 1.0, -900.0], [2000, 2.0, -800.0]]
    grid = np.array([500.0, 1000.0, 1500.0, 2500.0])
    mid, low, high = curve_band([solved, unsolved], 0, grid, [-150.0, None])
    assert np.isnan(mid[0])  # before any evaluation
    assert mid[1] == pytest.approx(-700.0) and low[1] == -900.0 and high[1] == -500.0
    assert mid[3] == -150.0  # the unsolved run's budget ended at 2000; the solved one holds


def test_the_scaling_section_shows_each_count_against_the_fewest_actors(tmp_path: Path) -> None:
    """bench.learning.scaling --docs writes results/scaling-CONFIG.json; the report tabulates it: speedups
    against the fewest actors, a dash where a count's median is missing (a run missed the target)."""
    def count(seconds: float | None, steps_per_s: float) -> dict[str, object]:
        return {"solved": 3 if seconds else 2, "steps_per_s": steps_per_s, "updates_per_s": steps_per_s / 16,
                "seconds_to_target": seconds, "env_steps_to_target": 45_000 if seconds else None,
                "of_ideal_steps_per_s": 0.9, "actor_staleness": 1.0, "runs": [{}, {}, {}]}

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "scaling-x-slowsim.json").write_text(json.dumps({
        "config": "configs/x-slowsim.yaml", "latency_ms": 2.0, "target": 475.0, "seeds": 3, "date": "2026-11-27",
        "cores": 2, "actors": {"1": count(120.0, 440.0), "8": count(20.0, 3300.0), "4": count(None, 1700.0)}}))
    report = tmp_path / "results.md"
    write_report(tmp_path / "runs.jsonl", report)
    text = report.read_text()
    assert "## Scaling with a slow simulator" in text and "### x-slowsim.yaml: 2 ms per env step" in text
    assert "| 1 | 3/3 | 120.0 | 1.00 | 45.0k | 440.0 | 1.00 |" in text
    assert "| 4 | 2/3 | – | – | – | 1700.0 | 3.86 |" in text
    assert "| 8 | 3/3 | 20.0 | 6.00 | 45.0k | 3300.0 | 7.50 |" in text
    assert text.index("| 4 |") < text.index("| 8 |")  # counts in order, not as strings
    assert "![scaling](results/scaling-x-slowsim.png)" in text
    assert "[results/scaling-x-slowsim.json](results/scaling-x-slowsim.json)" in text
    assert "**The config changed since this run** (or is gone)" in text  # no configs/x-slowsim.yaml


def test_the_scaling_section_says_when_the_config_changed_since_its_run(tmp_path: Path) -> None:
    config = "configs/cartpole-dqn-slowsim.yaml"
    base = {"config": config, "latency_ms": 2.0, "target": 475.0, "seeds": 3, "sets": [],
            "actors": {"1": {"solved": 3, "steps_per_s": 440.0, "updates_per_s": 27.0, "seconds_to_target": 100.0,
                             "env_steps_to_target": 45_000, "runs": [{}, {}, {}]}}}
    (tmp_path / "results").mkdir()
    report = tmp_path / "results.md"
    for digest, stale in ((settings_digest(ROOT / config), False), ("0123456789ab", True)):
        (tmp_path / "results" / "scaling-cartpole-dqn-slowsim.json").write_text(
            json.dumps({**base, "config_digest": digest}))
        write_report(tmp_path / "runs.jsonl", report)
        assert ("**The config changed since this run**" in report.read_text()) == stale
