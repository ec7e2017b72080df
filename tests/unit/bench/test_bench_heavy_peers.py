"""The SB3 peers of bench.learning.suite's heavy rows: each runs to the row's wall budget.

Real peers on the real envs (MuJoCo, Box2D, ale-py), each for a wall budget of two seconds: start-up and
a few env steps, an evaluation cut short, or one that ends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bench.learning.suite import PEERS, ROWS, SUITE, run_side
from bench.peers import sb3_peers
from bench.peers.sb3_atari import ATARI_EVAL_EVERY
from bench.peers.sb3_peers import run_peer
from bench.peers.sb3_sac import SAC_EVAL_EVERY

HEAVY = [row.name for row in SUITE if row.max_seconds is not None]
WALL = 2.0
# Building the envs and the model, then the first step after the budget: a generous bound (a loaded machine
# took over 15 s to build Hopper's), where a peer that ignored its wall budget would run 10M env steps for hours
START_UP = 120.0


def children() -> set[int]:
    """This process's child processes (a peer that leaves one behind leaks it)."""
    me, found = str(os.getpid()), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if fields[1] == me:
            found.add(int(stat.parent.name))
    return found


def test_every_heavy_row_races_a_peer_that_evaluates_at_its_interval() -> None:
    assert HEAVY == ["bipedalwalker-sac", "hopper-sac", "pong-dqn", "breakout-ppo"]
    intervals = {**SAC_EVAL_EVERY, **ATARI_EVAL_EVERY}
    for name in HEAVY:
        row = ROWS[name]
        assert row.peer in PEERS, name
        assert intervals[row.env] == row.every, name


def test_the_suite_hands_a_peer_its_rows_wall_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def fake(env: str, seed: int, budget: int, max_seconds: float | None = None) -> dict[str, Any]:
        calls.append((env, seed, budget, max_seconds))
        return {"solved": False}

    row = ROWS["pong-dqn"]
    assert row.peer is not None
    monkeypatch.setitem(PEERS, row.peer, (fake, 1))
    assert run_side(row, "sb3", 3) == {"solved": False, "torch_threads": 1}
    assert calls == [("ALE/Pong-v5", 3, row.budget, row.max_seconds)]


@pytest.mark.parametrize("name", HEAVY)
def test_a_heavy_peer_stops_at_its_wall_budget(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    row = ROWS[name]
    assert row.peer is not None
    # evaluations due from the first steps, with no grace past the budget: a MuJoCo or Box2D one may end
    # within it, an Atari one (10 whole games) is cut short and not counted
    monkeypatch.setitem(SAC_EVAL_EVERY, row.env, 50)
    monkeypatch.setitem(ATARI_EVAL_EVERY, row.env, 50)
    monkeypatch.setattr(sb3_peers, "EVAL_GRACE_S", 0.0)
    peer, _ = PEERS[row.peer]
    before = children()
    result = run_peer(peer, 1, row.env, 0, row.budget, max_seconds=WALL)
    assert result["out_of_time"] and not result["solved"]
    assert WALL <= result["wall_s"] < WALL + START_UP
    assert 0 < result["env_steps"] < row.budget
    assert len(result["curve"]) == result["evaluations"]
    assert all(steps % 50 == 0 and seconds <= WALL for steps, seconds, _ in result["curve"])
    best = max((c[2] for c in result["curve"]), default=None)
    assert result["best_return"] == best
    assert children() <= before
