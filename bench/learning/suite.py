"""Every shipped config on several seeds, beside its Stable-Baselines3 peer, into docs/results.md.

    .venv/bin/python -m bench.learning.suite [--configs cartpole-dqn,lunarlander-appo] [--seeds 5]
                                            [--first-seed 0] [--sides fleet,sb3,serial] [--again]
    .venv/bin/python -m bench.learning.suite --report-only

Each row of :data:`SUITE` is a shipped config (``cartpole-appo`` is cartpole-ppo.yaml with
``--sync async``) with its target, env-step budget, evaluation interval and, where one exists, its SB3
peer (the rl-baselines3-zoo's settings for the env, at its best: bench/peers/; SB3's DQN evaluates every
5,000 env steps, so the DQN rows do). Sides:

- ``fleet``: `rlfleet up` of the config (its actors, its protocol);
- ``sb3``: the peer on the same seed and budget (the runs file keeps one set of peer runs per env and
  algorithm, shared by the rows that race it);
- ``serial``: `rlfleet train --serial` of the config, where the serial runner runs it (no
  planners): what the algorithm does apart from the fleet.

Every side is scored alike: the mean return of 10 greedy (mean-action) episodes on fixed seeds every
``every`` env steps; a run is solved at the first evaluation at or above the target, its wall seconds
counted from launch (start-up and evaluations included). Heavy rows (pixels, MuJoCo, BipedalWalker)
have no target on two cores: they run to a wall budget and report the best evaluation.

A run is one seed of one side of one row, appended to the runs file (JSON lines) as it ends, so a
suite of hours is gathered over several sittings: a run the file already holds is skipped unless
``--again``. The report (written after every run, or alone with ``--report-only``) is
docs/results.md: one row per config (solved k/N, median env steps and wall seconds over the solved
runs, the peer's, the wall-seconds ratio, the serial runner's env steps, date, cores) and one figure
per env (docs/results/ENV.png): greedy evaluation return against env steps and against wall seconds,
median over seeds with the min-max band, every row and side on the same axes.

Last line: one JSON object (per row: solved counts and medians of each side).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.learning import peer_results
from bench.learning.config_digest import settings_digest
from bench.learning.serial import run_serial_config
from bench.learning.time_to_solve import run_fleet
from bench.peers.sb3_a2c import run_sb3_a2c
from bench.peers.sb3_atari import run_sb3_atari_dqn, run_sb3_atari_ppo
from bench.peers.sb3_peers import PEER_THREADS, run_peer, run_sb3_dqn, run_sb3_ppo
from bench.peers.sb3_sac import run_sb3_sac
from bench.peers.sb3_td3 import run_sb3_td3

ROOT = Path(__file__).resolve().parents[2]
RUNS_FILE = ROOT / "docs" / "results" / "runs.jsonl"
REPORT = ROOT / "docs" / "results.md"
CORES = len(os.sched_getaffinity(0))

# peer name -> (run function taking (env, seed, budget, max_seconds=), its algorithm's torch threads)
PEERS: dict[str, tuple[Callable[..., dict[str, Any]], int]] = {
    "dqn": (run_sb3_dqn, PEER_THREADS["dqn"]), "ppo": (run_sb3_ppo, PEER_THREADS["ppo"]),
    "sac": (run_sb3_sac, PEER_THREADS["sac"]), "a2c": (run_sb3_a2c, PEER_THREADS["a3c"]),
    "td3": (run_sb3_td3, PEER_THREADS["td3"]),
    "dqn-atari": (run_sb3_atari_dqn, PEER_THREADS["dqn-atari"]),
    "ppo-atari": (run_sb3_atari_ppo, PEER_THREADS["ppo-atari"]),
}


@dataclass(frozen=True)
class Row:
    """One line of the results table: a shipped config and how it is judged."""

    name: str
    config: str  # file under configs/
    env: str
    algorithm: str
    protocol: str
    target: float | None  # None: a heavy row, run to its wall budget, best evaluation reported
    budget: int  # env steps, every side
    every: int  # env steps between evaluations, every side
    peer: str | None = None  # a key of PEERS
    serial: bool = True  # the serial runner runs it (no planners)
    max_seconds: float | None = None  # wall budget of each side (heavy rows)
    sets: tuple[str, ...] = field(default=())  # `--set` overrides of the config, every side

    @property
    def peer_key(self) -> str:
        """Runs of the peer are shared by the rows that race it on the same env and budget (env steps, and
        wall seconds where the row has a wall budget)."""
        wall = f":{self.max_seconds:g}s" if self.max_seconds is not None else ""
        return f"sb3-{self.peer}:{self.env}:{self.budget}{wall}"


SUITE: tuple[Row, ...] = (
    Row("cartpole-dqn", "cartpole-dqn.yaml", "CartPole-v1", "Ape-X DQN", "async", 475, 50_000, 5_000, "dqn"),
    Row("cartpole-dqn-barrier", "cartpole-dqn-barrier.yaml", "CartPole-v1", "Ape-X DQN", "barrier", 475, 50_000, 5_000,
        "dqn"),
    Row("cartpole-dqn-hogwild", "cartpole-dqn-hogwild.yaml", "CartPole-v1", "HogWild DQN", "async", 475, 300_000,
        5_000, "dqn"),
    Row("cartpole-dynaq", "cartpole-dynaq.yaml", "CartPole-v1", "Dyna-Q", "async", 475, 50_000, 5_000, "dqn",
        serial=False),
    Row("cartpole-ppo", "cartpole-ppo.yaml", "CartPole-v1", "DPPO", "barrier", 475, 200_000, 2_000, "ppo"),
    Row("cartpole-appo", "cartpole-ppo.yaml", "CartPole-v1", "APPO", "async", 475, 200_000, 2_000, "ppo",
        sets=("sync=async",)),
    Row("cartpole-a3c", "cartpole-a3c.yaml", "CartPole-v1", "A3C", "async", 475, 500_000, 5_000, "a2c"),
    Row("cartpole-a2c", "cartpole-a2c.yaml", "CartPole-v1", "A2C", "barrier", 475, 500_000, 5_000, "a2c"),
    Row("lunarlander-dqn", "lunarlander-dqn.yaml", "LunarLander-v3", "DQN", "async", 200, 500_000, 5_000, "dqn"),
    Row("lunarlander-ppo", "lunarlander-ppo.yaml", "LunarLander-v3", "DPPO", "barrier", 200, 1_500_000, 10_000,
        "ppo"),
    Row("lunarlander-appo", "lunarlander-appo.yaml", "LunarLander-v3", "APPO", "async", 200, 1_500_000, 10_000,
        "ppo"),
    Row("lunarlandercontinuous-ppo", "lunarlandercontinuous-ppo.yaml", "LunarLanderContinuous-v3", "DPPO",
        "barrier", 200, 1_500_000, 10_000, "ppo"),
    Row("lunarlandercontinuous-sac", "lunarlandercontinuous-sac.yaml", "LunarLanderContinuous-v3", "SAC", "async",
        200, 500_000, 10_000, "sac"),
    Row("pendulum-sac", "pendulum-sac.yaml", "Pendulum-v1", "SAC", "async", -200, 20_000, 1_000, "sac"),
    Row("pendulum-td3", "pendulum-td3.yaml", "Pendulum-v1", "TD3", "async", -200, 20_000, 1_000, "td3"),
    Row("mountaincarcontinuous-sac", "mountaincarcontinuous-sac.yaml", "MountainCarContinuous-v0", "SAC", "async",
        90, 50_000, 2_000, "sac"),
    Row("bipedalwalker-sac", "bipedalwalker-sac.yaml", "BipedalWalker-v3", "SAC", "async", None, 10_000_000,
        20_000, "sac", max_seconds=1800),
    Row("hopper-sac", "hopper-sac.yaml", "Hopper-v5", "SAC", "async", None, 10_000_000, 20_000, "sac",
        max_seconds=1800),
    Row("pong-dqn", "pong-dqn.yaml", "ALE/Pong-v5", "Ape-X DQN", "async", None, 10_000_000, 50_000, "dqn-atari",
        max_seconds=1800),
    Row("breakout-ppo", "breakout-ppo.yaml", "ALE/Breakout-v5", "DPPO", "barrier", None, 10_000_000, 50_000,
        "ppo-atari", max_seconds=1800),
)
ROWS = {row.name: row for row in SUITE}


# -- the runs file ------------------------------------------------------------

def side_key(row: Row, side: str) -> str:
    """Where a side's runs are filed: the row's own name, or the peer's key shared by rows on its env."""
    return row.peer_key if side == "sb3" else f"{side}:{row.name}:{row.budget}"


def config_digest(row: Row) -> str:
    """What a fleet or serial run ran (:func:`settings_digest` of the row's config and overrides). A run of an
    older config no longer counts for the row; a new field whose default keeps the old behaviour leaves every
    run counted (a changed default does too: change the config, or run ``--again``)."""
    return settings_digest(ROOT / "configs" / row.config, row.sets)


def current(row: Row, entry: dict[str, Any]) -> bool:
    """Whether a runs-file entry ran the row's config as it is now (the peer's runs always count)."""
    return entry["side"] == "sb3" or entry.get("config") == config_digest(row)


def load_runs(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """(side key, seed) -> the latest entry the runs file holds."""
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                runs[entry["key"], int(entry["seed"])] = entry
    return runs


def run_side(row: Row, side: str, seed: int) -> dict[str, Any]:
    """One run of one side of ``row`` on ``seed``."""
    sets = [x for s in row.sets for x in ("--set", s)]
    if side == "fleet":
        run = run_fleet(ROOT / "configs" / row.config, seed, None, row.budget, row.every, row.target, sets,
                        row.max_seconds)
        run.pop("run_dir", None)  # a temporary path of this machine: not kept
        return run
    if side == "serial":
        return run_serial_config(ROOT / "configs" / row.config, seed, row.budget, row.every, row.target,
                                 row.max_seconds, sets)
    assert row.peer is not None
    peer, threads = PEERS[row.peer]
    return run_peer(peer, threads, row.env, seed, row.budget, max_seconds=row.max_seconds)


def sides_of(row: Row, wanted: list[str]) -> list[str]:
    return [s for s in wanted if (s != "sb3" or row.peer) and (s != "serial" or row.serial)]


# -- the report ---------------------------------------------------------------

def summary(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Solved k/N and the medians over the solved runs (over every run for a heavy row)."""
    if not runs:
        return None
    solved = [r for r in runs if r["solved"]]
    over = solved or runs
    best = [r["best_return"] for r in runs if r.get("best_return") is not None]
    return {"solved": len(solved), "runs": len(runs),
            "median_env_steps": statistics.median(r["env_steps"] for r in over),
            "median_wall_s": round(statistics.median(r["wall_s"] for r in over), 1),
            "median_best_return": round(statistics.median(best), 1) if best else None}


def row_runs(row: Row, side: str, runs: dict[tuple[str, int], dict[str, Any]],
             seeds: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """The row's current runs of ``side`` (on ``seeds`` only, if given), in seed order."""
    key, wanted = side_key(row, side), None if seeds is None else set(seeds)
    return [runs[k]["run"] for k in sorted(runs)
            if k[0] == key and (wanted is None or k[1] in wanted) and current(row, runs[k])]


def seeds_of(row: Row, side: str, runs: dict[tuple[str, int], dict[str, Any]]) -> set[int]:
    key = side_key(row, side)
    return {seed for (k, seed), entry in runs.items() if k == key and current(row, entry)}


def row_dates(row: Row, runs: dict[tuple[str, int], dict[str, Any]]) -> tuple[str, int | None]:
    keys = {side_key(row, s) for s in ("fleet", "sb3", "serial")}
    entries = [e for (k, _), e in runs.items() if k in keys]
    if not entries:
        return "", None
    return max(e["date"] for e in entries)[:10], max(int(e.get("cores", 0)) for e in entries)


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def fmt_steps(x: float | None) -> str:
    return "" if x is None else f"{x / 1000:.1f}k" if x < 1e6 else f"{x / 1e6:.2f}M"


def cell_solved(row: Row, s: dict[str, Any] | None) -> str:
    if s is None:
        return "–"
    if row.target is None:
        return f"best {s['median_best_return']} ({plural(s['runs'], 'run')})"
    return f"{s['solved']}/{s['runs']}"


def cell_steps(row: Row, s: dict[str, Any] | None) -> str:
    return fmt_steps(s["median_env_steps"]) if s and (s["solved"] or row.target is None) else "–"


def cell_wall(row: Row, s: dict[str, Any] | None) -> str:
    return f"{s['median_wall_s']:.1f}" if s and (s["solved"] or row.target is None) else "–"


def table(runs: dict[tuple[str, int], dict[str, Any]], seeds: range) -> tuple[list[str], dict[str, Any]]:
    lines = ["| config | env | algorithm | protocol | solved | env steps | wall s | SB3 solved | SB3 env steps "
             "| SB3 wall s | wall ratio | serial solved | serial env steps | date | cores |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    figures: dict[str, Any] = {}
    for row in SUITE:
        fleet, peer, serial = (summary(row_runs(row, s, runs, seeds)) for s in ("fleet", "sb3", "serial"))
        if fleet is None and serial is None:  # a peer's runs alone (shared with another row) make no row
            continue
        figures[row.name] = {"fleet": fleet, "sb3": peer, "serial": serial}

        ratio = (f"{fleet['median_wall_s'] / peer['median_wall_s']:.2f}"
                 if fleet and peer and fleet["solved"] and peer["solved"] else "–")
        date, cores = row_dates(row, runs)
        target = "" if row.target is None else f" ≥ {row.target:g}"
        budget = f"{fmt_steps(row.budget)} steps" if row.max_seconds is None else f"{row.max_seconds:g} s"
        lines.append(f"| {row.name} | {row.env}{target} ({budget}) | {row.algorithm} | {row.protocol} | "
                     f"{cell_solved(row, fleet)} | {cell_steps(row, fleet)} | {cell_wall(row, fleet)} | "
                     f"{cell_solved(row, peer)} | {cell_steps(row, peer)} | {cell_wall(row, peer)} | {ratio} | "
                     f"{cell_solved(row, serial)} | {cell_steps(row, serial)} | {date} | {cores or ''} |")
    return lines, figures


def algorithm_check(runs: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    """The serial runner against SB3 on every seed both ran (more than the table's, where gathered): is the
    algorithm apart from the fleet as sample-efficient as SB3's on the same hyperparameters?"""
    lines = ["| config | seeds | serial solved | serial median env steps | SB3 solved | SB3 median env steps "
             "| env-steps ratio |", "|---|---|---|---|---|---|---|"]
    for row in SUITE:
        if not row.serial or row.peer is None or row.target is None:
            continue
        common = sorted(seeds_of(row, "serial", runs) & seeds_of(row, "sb3", runs))
        serial, peer = (summary(row_runs(row, side, runs, common)) for side in ("serial", "sb3"))
        if serial is None or peer is None:
            continue
        ratio = (f"{serial['median_env_steps'] / peer['median_env_steps']:.2f}"
                 if serial["solved"] and peer["solved"] else "–")
        span = f"{common[0]}-{common[-1]}" if common == list(range(common[0], common[-1] + 1)) else str(common)
        lines.append(f"| {row.name} | {span} ({len(common)}) | {serial['solved']}/{serial['runs']} | "
                     f"{cell_steps(row, serial)} | {peer['solved']}/{peer['runs']} | {cell_steps(row, peer)} | "
                     f"{ratio} |")
    return lines if len(lines) > 2 else []


def scaling_section(results: Path) -> list[str]:
    """The scaling benchmark's latest figures per slow-simulator config (``bench.learning.scaling --docs``
    writes results/scaling-CONFIG.json and .png): time to target and env steps/s against the actor count."""
    lines: list[str] = []
    for path in sorted(results.glob("scaling-*.json")):
        r = json.loads(path.read_text())
        counts = sorted(r["actors"], key=int)
        base = r["actors"][counts[0]]
        config = ROOT / r["config"]
        stale = (not config.is_file() or "config_digest" not in r
                 or settings_digest(config, r.get("sets", [])) != r["config_digest"])
        lines += [f"### {Path(r['config']).name}: {r['latency_ms']:g} ms per env step, target {r['target']:g}", "",
                  *([f"**The config changed since this run** (or is gone): run `bench.learning.scaling --docs"
                     f" --config {r['config']}` again.", ""] if stale else []),
                  f"`bench.learning.scaling --config {r['config']} --actors {','.join(counts)} --seeds {r['seeds']}`"
                  f" ({r.get('date', '')}, {r.get('cores', '')} cores); medians over the seeds, a dash where a"
                  " run missed the target. Speedups against the fewest actors.", "",
                  "| actors | solved | seconds to target | speedup | env steps to target | env steps/s "
                  "| speedup (steps/s) | of ideal | updates/s | actor staleness |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n in counts:
            c = r["actors"][n]

            def ratio(a: float | None, b: float | None) -> str:
                return f"{a / b:.2f}" if a and b else "–"

            lines.append(
                f"| {n} | {c['solved']}/{len(c['runs'])} | {c['seconds_to_target'] or '–'} | "
                f"{ratio(base['seconds_to_target'], c['seconds_to_target'])} | "
                f"{fmt_steps(c['env_steps_to_target']) or '–'} | {c['steps_per_s']} | "
                f"{ratio(c['steps_per_s'], base['steps_per_s'])} | {c.get('of_ideal_steps_per_s', '–')} | "
                f"{c['updates_per_s']} | {c.get('actor_staleness') or '–'} |")
        lines += ["", f"The benchmark's JSON line: [{results.name}/{path.name}]({results.name}/{path.name}).", "",
                  f"![scaling]({results.name}/{path.stem}.png)", ""]
    return lines


def curve_band(curves: list[list[list[float]]], axis: int, grid: np.ndarray, solved_value: list[float | None]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Median, min and max over runs of each run's last evaluation at or before each grid point (a run that
    stopped at its target keeps that return after it stopped; before its first evaluation: nothing)."""
    values = np.full((len(curves), len(grid)), np.nan)
    for i, curve in enumerate(curves):
        xs = np.array([c[axis] for c in curve], float)
        ys = np.array([c[2] for c in curve], float)
        if not len(xs):
            continue
        index = np.searchsorted(xs, grid, side="right") - 1
        values[i] = np.where(index >= 0, ys[np.clip(index, 0, None)], np.nan)
        if solved_value[i] is None:  # an unsolved run ends where its budget ended
            values[i, grid > xs[-1]] = np.nan
    with warnings.catch_warnings():  # a grid point no run reached: all-NaN, drawn as a gap
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(values, 0), np.nanmin(values, 0), np.nanmax(values, 0)


def plot_env(env: str, rows: list[Row], runs: dict[tuple[str, int], dict[str, Any]], seeds: range, out: Path
             ) -> bool:
    """docs/results/ENV.png: return against env steps and against wall seconds, every row and side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    drawn = 0
    lowest, highest = np.inf, -np.inf  # of the median lines: the bands' outliers do not set the scale
    seen_peers: set[str] = set()
    for row in rows:
        for side in ("fleet", "serial", "sb3"):
            if side == "sb3" and row.peer_key in seen_peers:
                continue
            found = row_runs(row, side, runs, seeds)
            curves = [r["curve"] for r in found if r.get("curve")]
            if not curves:
                continue
            if side == "sb3":
                seen_peers.add(row.peer_key)
            label = f"SB3 {row.peer}" if side == "sb3" else f"{row.name}" + (" (serial)" if side == "serial" else "")
            for ax, axis in zip(axes, (0, 1), strict=True):
                end = max(c[-1][axis] for c in curves)
                grid = np.linspace(0, end, 120)
                mid, low, high = curve_band(curves, axis, grid, [r["best_return"] if r["solved"] else None
                                                                 for r in found if r.get("curve")])
                line, = ax.plot(grid, mid, label=f"{label} ({plural(len(curves), 'seed')})",
                                linestyle="--" if side == "serial" else ":" if side == "sb3" else "-")
                ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.12, linewidth=0)
                if np.isfinite(mid).any():
                    lowest, highest = min(lowest, float(np.nanmin(mid))), max(highest, float(np.nanmax(mid)))
            drawn += 1
    if not drawn:
        plt.close(fig)
        return False
    target = next((r.target for r in rows if r.target is not None), None)
    for ax, xlabel in zip(axes, ("env steps", "wall seconds"), strict=True):
        if target is not None:
            ax.axhline(target, color="grey", linewidth=0.8)
        ax.set_xlabel(xlabel)
        if np.isfinite(lowest):
            margin = 0.05 * max(highest - lowest, 1.0)
            ax.set_ylim(lowest - margin, highest + margin)
        ax.set_ylabel("greedy evaluation return (10 episodes)")
        ax.grid(alpha=0.3)
    axes[0].set_title(f"{env}: median over seeds, min-max band")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=80, metadata={"Software": None})
    plt.close(fig)
    return True


def write_report(runs_file: Path, report: Path, seeds: range = range(5)) -> dict[str, Any]:
    """docs/results.md and its figures: the table and figures of ``seeds`` (the suite's), then the serial
    runner against SB3 on every seed both ran."""
    runs = load_runs(runs_file)
    lines, figures = table(runs, seeds)
    check = algorithm_check(runs)
    scaling = scaling_section(report.parent / "results")
    peers = peer_results.section(report.parent / "results")
    envs = list(dict.fromkeys(row.env for row in SUITE))
    pictures = []
    for env in envs:
        name = env.replace("/", "-")
        if plot_env(env, [r for r in SUITE if r.env == env], runs, seeds, report.parent / "results" / f"{name}.png"):
            pictures.append(f"![{env}](results/{name}.png)")
    text = [
        "# What it solves and how fast",
        "",
        "Every shipped config through the fleet (`rlfleet up`, the config's actors and protocol), beside",
        "Stable-Baselines3 with the rl-baselines3-zoo's settings for the env (same seeds, same budget, same",
        "evaluations) and the serial runner (`rlfleet train --serial`: the same algorithm objects in one",
        "process). Gathered by `bench.learning.suite` (its docstring gives the method) into",
        "[results/runs.jsonl](results/runs.jsonl); this page is written from that file.",
        "",
        "A run is solved at the first evaluation (10 greedy episodes on fixed seeds) at or above the target;",
        "env steps and wall seconds (from launch, start-up included) are medians over the solved runs. The",
        "wall ratio is the fleet's median over SB3's. Rows without a target are heavy for two cores: they",
        "run to a wall budget and show the medians of each run's best evaluation, of the env steps it made",
        f"and of its wall seconds. A dash: no run, or none solved. Seeds {seeds.start}-{seeds.stop - 1}.",
        "",
        *lines,
        "",
        *(["## The algorithm apart from the fleet", "",
           "The serial runner against SB3 on the same hyperparameters, on every seed both sides ran (the",
           "table's and any more gathered with `--first-seed`): env steps to solve, medians over the solved",
           "runs. tests/unit/algorithms/test_ppo_matches_sb3.py checks that one PPO learn call equals SB3's.",
           "", *check, ""] if check else []),
        *(["## Scaling with a slow simulator", "",
           "Time to target with 1 to 8 actors when every env step waits (`env.step_latency_ms`), on the",
           "slow-simulator configs (configs/*-slowsim.yaml; the rule for choosing the replay ratio:",
           "[configuration.md](configuration.md#replay-ratio-and-actors)). Reading and history:",
           "[scaling.md](scaling.md).", "", *scaling] if scaling else []),
        *(["## Against the distributed peers", "",
           "Sample Factory and RLlib raced in the same run as rlfleet (`make peers` builds their venvs;",
           "`--docs` keeps a race's JSON line for this page).", "", *peers] if peers else []),
        *[line for picture in pictures for line in (picture, "")],
    ]
    report.write_text("\n".join(text))
    return figures


# -- main ---------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(r.name for r in SUITE if r.max_seconds is None),
                        help=f"rows to run, comma-separated (default: every row with a target); of {', '.join(ROWS)}")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--sides", default="fleet,sb3", help="of fleet, sb3, serial")
    parser.add_argument("--runs-file", type=Path, default=RUNS_FILE)
    parser.add_argument("--report", type=Path, default=REPORT)
    parser.add_argument("--again", action="store_true", help="run again what the runs file holds already")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--report-seeds", default=None, metavar="FIRST:COUNT",
                        help="the seeds of the table and figures (default 0:5)")
    args = parser.parse_args()
    rows = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = [name for name in rows if name not in ROWS]
    if unknown:
        parser.error(f"--configs: no row {unknown}; allowed: {', '.join(ROWS)}")
    wanted = [s.strip() for s in args.sides.split(",")]
    if not set(wanted) <= {"fleet", "sb3", "serial"}:
        parser.error(f"--sides {args.sides!r}: allowed fleet, sb3, serial")
    # the table is of the suite's seeds (0-4 unless --report-seeds): runs on more seeds (--first-seed) count
    # in the serial-against-SB3 check only, so every column of a row is the same seeds
    first, count = (int(x) for x in args.report_seeds.split(":")) if args.report_seeds else (0, 5)
    report_seeds = range(first, first + count)
    if not args.report_only:
        args.runs_file.parent.mkdir(parents=True, exist_ok=True)
        for name in rows:
            row = ROWS[name]
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for side in sides_of(row, wanted):
                    key = side_key(row, side)
                    held = load_runs(args.runs_file).get((key, seed))
                    if held is not None and current(row, held) and not args.again:
                        continue
                    run = run_side(row, side, seed)
                    entry = {"key": key, "row": row.name, "side": side, "seed": seed, "cores": CORES,
                             "date": time.strftime("%Y-%m-%d %H:%M"), "run": run}
                    if side != "sb3":
                        entry["config"] = config_digest(row)
                    with open(args.runs_file, "a") as f:
                        f.write(json.dumps(entry) + "\n")
                    brief = {k: v for k, v in run.items() if k != "curve"}
                    print(name, side, json.dumps(brief), flush=True)
                    write_report(args.runs_file, args.report, report_seeds)
    figures = write_report(args.runs_file, args.report, report_seeds)
    print(json.dumps({"cores": CORES, "rows": {name: figures[name] for name in figures if name in rows}}))


if __name__ == "__main__":
    main()
