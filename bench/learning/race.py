"""The JSON blocks of a race between rlfleet and its peers (bench.learning.time_to_solve --peer).

One block per side (``rlfleet``, ``sb3``, ``sample_factory``, ``rllib``): solved, runs, median_wall_s,
env_steps_per_s. ``ratio_<peer>`` = rlfleet's median wall seconds over its solved runs / the peer's median
over all its runs, where a peer run that did not solve counts at the wall time it took to spend its budget
(a lower bound of its time to solve, so the ratio is then an upper bound): ``ratio_<peer>_unsolved`` says
how many runs were counted that way. None where rlfleet solved no run (no time to solve to compare).
"""

from __future__ import annotations

import statistics
from typing import Any


def block_name(peer: str) -> str:
    """The JSON key of a side: ``sample-factory`` -> ``sample_factory``."""
    return peer.replace("-", "_")


def side_block(runs: list[dict[str, Any]], over_solved: bool) -> dict[str, Any]:
    """A side's block. ``over_solved``: the median wall over solved runs only (rlfleet's; all runs where it
    solved none), else over every run, unsolved ones at their budget's wall time (a peer's)."""
    if not runs:
        raise ValueError("a side's block needs at least one run")
    solved = [r for r in runs if r["solved"]]
    over = (solved or runs) if over_solved else runs
    return {"solved": len(solved), "runs": len(runs),
            "median_wall_s": round(statistics.median(r["wall_s"] for r in over), 2),
            "env_steps_per_s": round(statistics.median(steps_per_s(r) for r in runs), 1),
            "wall_s": [r["wall_s"] for r in runs], "solved_by_seed": [bool(r["solved"]) for r in runs]}


def steps_per_s(run: dict[str, Any]) -> float:
    """A run's env steps over its wall seconds, start-up and evaluations included."""
    return float(run["env_steps"]) / run["wall_s"] if run["wall_s"] > 0 else 0.0


def ratio(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> float | None:
    """rlfleet's median wall over its solved runs / the peer's over all its runs (None: rlfleet solved none)."""
    solved = [r["wall_s"] for r in ours if r["solved"]]
    if not solved or not theirs:
        return None
    return round(statistics.median(solved) / statistics.median(r["wall_s"] for r in theirs), 3)


def race_blocks(ours: list[dict[str, Any]], peers: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The ``rlfleet`` block, one block per peer (by its name in ``--peer``) and a ratio against each."""
    out: dict[str, Any] = {"rlfleet": side_block(ours, over_solved=True)}
    for peer, runs in peers.items():
        key = block_name(peer)
        out[key] = side_block(runs, over_solved=False)
        out[f"ratio_{key}"] = ratio(ours, runs)
        out[f"ratio_{key}_unsolved"] = sum(not r["solved"] for r in runs)
    return out
