"""bench.learning.time_to_solve's runs file: a benchmark of hours run a seed and a side at a time, then summarised."""

from __future__ import annotations

import json
from pathlib import Path

from bench.learning.time_to_solve import record, recorded

KEY = {"algo": "sac", "env": "LunarLanderContinuous-v3", "sync": "async", "budget": 500_000, "sets": []}


def run(wall: float, solved: bool = True) -> dict[str, object]:
    return {"solved": solved, "wall_s": wall, "env_steps": 1000}


def test_the_latest_run_of_each_seed_and_side_counts_in_seed_order(tmp_path: Path) -> None:
    path = str(tmp_path / "runs.jsonl")
    record(path, KEY, "rlfleet", 1, run(30.0))
    record(path, KEY, "rlfleet", 0, run(50.0, solved=False))
    record(path, KEY, "sb3", 0, run(90.0))
    record(path, KEY, "rlfleet", 0, run(40.0))  # seed 0 again: this one counts
    assert [r["wall_s"] for r in recorded(path, KEY, "rlfleet")] == [40.0, 30.0]
    assert [r["wall_s"] for r in recorded(path, KEY, "sb3")] == [90.0]
    lines = [json.loads(line) for line in open(path)]
    assert len(lines) == 4 and all({"date", "seed", "side"} <= set(line) for line in lines)


def test_a_run_is_kept_without_its_temporary_directory(tmp_path: Path) -> None:
    path = str(tmp_path / "runs.jsonl")
    record(path, KEY, "rlfleet", 0, {**run(40.0), "run_dir": "/tmp/tts-x/run"})
    assert recorded(path, KEY, "rlfleet") == [run(40.0)]


def test_runs_of_another_setting_are_not_pooled(tmp_path: Path) -> None:
    path = str(tmp_path / "runs.jsonl")
    record(path, KEY, "rlfleet", 0, run(40.0))
    record(path, {**KEY, "budget": 200_000}, "rlfleet", 1, run(20.0))
    record(path, {**KEY, "sets": ["algorithm.lr=0.001"]}, "rlfleet", 2, run(10.0))
    assert [r["wall_s"] for r in recorded(path, KEY, "rlfleet")] == [40.0]
    assert recorded(str(tmp_path / "none.jsonl"), KEY, "rlfleet") == []


def test_without_a_file_nothing_is_written(tmp_path: Path) -> None:
    record(None, KEY, "rlfleet", 0, run(40.0))
    assert list(tmp_path.iterdir()) == []


def test_peer_runs_with_another_thread_count_are_not_pooled(tmp_path: Path) -> None:
    path = str(tmp_path / "runs.jsonl")
    record(path, KEY, "sb3", 0, {**run(90.0), "torch_threads": 1})
    record(path, KEY, "sb3", 1, {**run(70.0), "torch_threads": 2})
    assert [r["wall_s"] for r in recorded(path, KEY, "sb3", threads=2)] == [70.0]
    assert [r["wall_s"] for r in recorded(path, KEY, "sb3")] == [90.0, 70.0]


def test_a_peer_runs_with_the_threads_it_is_given_and_says_so() -> None:
    import torch

    from bench.peers.sb3_peers import run_peer

    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    result = run_peer(lambda seed: {"seed": seed, "threads_seen": torch.get_num_threads()}, other, 7)
    assert result == {"seed": 7, "threads_seen": other, "torch_threads": other}
    assert torch.get_num_threads() == before


def test_peer_runs_are_pooled_whatever_rlfleet_overrides(tmp_path: Path) -> None:
    from bench.learning.time_to_solve import peer_setting

    path = str(tmp_path / "runs.jsonl")
    record(path, KEY, "sb3", 0, {**run(90.0), "torch_threads": 2})
    tuned = {**KEY, "sets": ["algorithm.update_dtype=bfloat16"], "sync": "barrier"}
    assert recorded(path, tuned, "sb3") == []
    assert [r["wall_s"] for r in recorded(path, peer_setting(tuned), "sb3", threads=2)] == [90.0]
