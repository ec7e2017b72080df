"""`rlfleet report RUN_DIR [RUN_DIR ...]`: figures and a Markdown page of one or several runs.

Figures (PNG, FIG_SIZE pixels each), runs overlaid and labelled "config: algorithm, protocol, N actors";
every x axis starts at 0: env steps, and wall seconds from the command's start (start-up included):

- ``eval_return_vs_steps.png`` / ``eval_return_vs_time.png``: every greedy evaluation marked (band: +- std over
  its episodes), the training episodes' returns (mean of the last 20, dashed), each run's target
  (dotted) and the first evaluation that reached it (a star: the table's "to target");
- ``throughput.png``: env steps/s and learner updates/s over time (5 s moving average);
- ``replay_staleness.png``: replay size, and weights staleness in versions (see
  :func:`rlfleet.cli.rundata.staleness`);
- ``speedup.png`` (runs with two actor counts or more): time to target of the fewest
  actors divided by the time of N, and the same for env steps/s, beside the ideal N/N0.

``report.md`` beside them has the table (:class:`rlfleet.cli.rundata.Summary`, computed from the arrays the
figures draw) and every figure.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from statistics import median

import click
import numpy as np

from rlfleet.cli.rundata import (
    TRAINING_WINDOW,
    Run,
    RunError,
    Summary,
    default_target,
    load_run,
    staleness,
    summarize,
    to_target,
    trailing_mean,
)

FIG_SIZE = (960, 600)  # pixels of every figure
_DPI = 100

FIGURES = ("eval_return_vs_steps.png", "eval_return_vs_time.png", "throughput.png", "replay_staleness.png")


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def new_figure(rows: int = 1):  # type: ignore[no-untyped-def]  # (figure, [rows] axes) of the report's size
    plt = _plt()
    fig, axes = plt.subplots(rows, 1, figsize=(FIG_SIZE[0] / _DPI, FIG_SIZE[1] / _DPI), dpi=_DPI, sharex=True,
                             squeeze=False)
    return fig, list(axes[:, 0])


def _save(fig, path: Path) -> None:  # type: ignore[no-untyped-def]
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)  # no bbox_inches="tight": every figure keeps FIG_SIZE
    _plt().close(fig)


def _labels(runs: Sequence[Run]) -> list[str]:
    """'config: algorithm, sync, N actors', with the run's name added where two runs would share a label."""
    base = [r.label for r in runs]
    return [f"{b} ({r.name})" if base.count(b) > 1 else b for b, r in zip(base, runs, strict=True)]


def plot_returns(runs: Sequence[Run], x: str, path: Path, targets: Sequence[float | None]) -> None:
    fig, (ax,) = new_figure()
    draw_returns(ax, runs, x, targets)
    _save(fig, path)


def draw_returns(ax, runs: Sequence[Run], x: str, targets: Sequence[float | None]) -> None:  # type: ignore[no-untyped-def]
    """Evaluations (marked, +- std) and smoothed training returns of every run against ``x`` (env_steps or
    wall_s), with each run's target and the first evaluation that reached it."""
    shared = len(set(targets)) == 1
    for run, label, target in zip(runs, _labels(runs), targets, strict=True):
        color = None
        if run.has_evals:
            e = run.evals
            xs, mean, std = e[x], e["mean"], e["std"]
            (line,) = ax.plot(xs, mean, marker="o", ms=4, lw=1.6, label=f"{label}: evaluations")
            color = line.get_color()
            if len(xs) > 1:
                ax.fill_between(xs, mean - std, mean + std, color=color, alpha=0.15, lw=0)
            else:
                ax.errorbar(xs, mean, yerr=std, color=color, capsize=3, lw=1)
            hit = to_target(run, target)
            if hit is not None:
                ax.plot(hit[0] if x == "wall_s" else hit[1], mean[np.flatnonzero(mean >= target)[0]], marker="*",
                        ms=13, color=color, mec="black", mew=0.6, ls="none")
        ep = run.episodes
        if ep:
            (line,) = ax.plot(ep[x], trailing_mean(ep["return"], TRAINING_WINDOW), color=color, ls="--", lw=1,
                              alpha=0.8, label=f"{label}: training episodes (mean of last {TRAINING_WINDOW})")
            color = line.get_color()
        if target is not None and not shared:
            ax.axhline(target, color=color, ls=":", lw=1.2, label=f"{label}: target {target:g}")
        if x == "wall_s" and run.ready_s is not None and len(runs) == 1:
            ax.axvline(run.ready_s, color="grey", ls="-.", lw=0.8, label=f"fleet healthy ({run.ready_s:.1f} s)")
    if shared and targets[0] is not None:
        ax.axhline(targets[0], color="grey", ls=":", lw=1.2, label=f"target {targets[0]:g}")
    ax.set_xlim(left=0)
    ax.set_xlabel("env steps" if x == "env_steps" else "wall seconds from the command's start")
    ax.set_ylabel("episode return")
    what = "env steps" if x == "env_steps" else "wall time"
    ax.set_title(f"Return against {what} (greedy evaluations; *: first to reach the target)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)


def plot_throughput(runs: Sequence[Run], path: Path) -> None:
    fig, (top, bottom) = new_figure(2)
    for run, label in zip(runs, _labels(runs), strict=True):
        p = {k: v[1:] for k, v in run.progress.items()}  # the first row has no rate yet
        top.plot(p["wall_s"], trailing_mean(p["env_steps_per_s"], 5), label=label, lw=1.4)
        bottom.plot(p["wall_s"], trailing_mean(p["updates_per_s"], 5), label=label, lw=1.4)
    top.set_ylabel("env steps / s")
    bottom.set_ylabel("learner updates / s")
    bottom.set_xlabel("wall seconds")
    top.set_title("Throughput (5 s moving average)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
    top.legend(loc="best", fontsize=9)
    _save(fig, path)


def plot_replay_staleness(runs: Sequence[Run], path: Path) -> None:
    fig, (top, bottom) = new_figure(2)
    for run, label in zip(runs, _labels(runs), strict=True):
        p = run.progress
        (line,) = top.plot(p["wall_s"], p["replay_size"], label=label, lw=1.4)
        s = staleness(run)
        bottom.plot(s["wall_s"], s["evaluator"], color=line.get_color(), lw=1.2, label=f"{label}: evaluator")
        if "actors" in s:
            bottom.plot(s["wall_s"], s["actors"], color=line.get_color(), lw=1.2, ls=":",
                        label=f"{label}: actors")
    top.set_ylabel("replay size (items)")
    top.set_title("Replay size and weights staleness")
    bottom.set_ylabel("staleness (versions)")
    bottom.set_xlabel("wall seconds")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
    top.legend(loc="best", fontsize=9)
    bottom.legend(loc="best", fontsize=8)
    _save(fig, path)


def speedups(summaries: Sequence[Summary]) -> list[dict[str, float | int | None]]:
    """Per actor count (median over runs of that count): speedup in time to target and in
    env steps/s over the fewest actors, and the ideal N / N0. Empty with one actor count."""
    by_n: dict[int, list[Summary]] = defaultdict(list)
    for s in summaries:
        by_n[s.actors].append(s)
    if len(by_n) < 2:
        return []
    counts = sorted(by_n)
    n0 = counts[0]

    def time_of(n: int) -> float | None:
        times = [s.seconds_to_target for s in by_n[n]]
        return median(times) if times and all(t is not None for t in times) else None  # type: ignore[type-var]

    def rate_of(n: int) -> float:
        return median(s.steps_per_s for s in by_n[n])

    t0, r0 = time_of(n0), rate_of(n0)
    out: list[dict[str, float | int | None]] = []
    for n in counts:
        tn = time_of(n)
        out.append({
            "actors": n, "ideal": n / n0,
            "seconds_to_target": tn,
            "speedup_time": (t0 / tn) if (t0 is not None and tn) else None,
            "steps_per_s": rate_of(n),
            "speedup_steps": rate_of(n) / r0 if r0 > 0 else None,
        })
    return out


def plot_speedup(rows: Sequence[dict[str, float | int | None]], path: Path, target: float | None) -> None:
    fig, (ax,) = new_figure()
    n0 = rows[0]["actors"]
    xs = np.arange(len(rows))
    width = 0.27
    series = (("speedup_time", f"time to target {target:g}" if target is not None else "time to target"),
              ("speedup_steps", "env steps / s"), ("ideal", f"ideal (N / {n0})"))
    for i, (key, name) in enumerate(series):
        vals = [float(r[key]) if r[key] is not None else 0.0 for r in rows]  # type: ignore[arg-type]
        bars = ax.bar(xs + (i - 1) * width, vals, width, label=name,
                      color=("tab:blue", "tab:orange", "lightgrey")[i],
                      edgecolor="black" if key == "ideal" else None, lw=0.6)
        for bar, r in zip(bars, rows, strict=True):
            text = "n/r" if r[key] is None else f"{float(r[key]):.1f}"  # type: ignore[arg-type]
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(xs, [f"{r['actors']} actor{'s' if r['actors'] != 1 else ''}" for r in rows])
    ax.set_ylabel(f"speedup over {n0} actor{'s' if n0 != 1 else ''}")
    ax.set_title("Scaling: speedup against actors (n/r: target not reached)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="upper left", fontsize=9)
    _save(fig, path)


def _fmt(v: float | int | None, spec: str = ".1f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def markdown(summaries: Sequence[Summary], figures: Sequence[str], rows: Sequence[dict[str, float | int | None]],
             target_note: str) -> str:
    lines = [
        "# rlfleet report", "",
        f"Targets: {target_note}. Seconds count from the command's start (`rlfleet up`: start-up included;",
        "start-up s: until every service was first healthy). To target: the first evaluation whose mean reached",
        "the target, the star on the figures (the launcher stops at the next 1 s scrape after it). Returns:",
        "greedy evaluations (evaluations.csv); training return: mean of the last",
        f"{TRAINING_WINDOW} training episodes of all actors (episodes/*.csv). Steps/s and updates/s: means over",
        "progress.csv.", "",
        "| run | config | algorithm | sync | actors | target | evaluations | final return | best return | "
        "training return | seconds to target | env steps to target | start-up s | seconds | env steps | "
        "env steps/s | updates/s |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.run} | {s.config} | {s.algorithm} | {s.sync} | {s.actors} | {_fmt(s.target, 'g')} "
            f"| {s.evaluations} | {_fmt(s.final_return)} | {_fmt(s.best_return)} | {_fmt(s.training_return)} "
            f"| {_fmt(s.seconds_to_target)} | {_fmt(s.env_steps_to_target, 'd')} | {_fmt(s.ready_s)} "
            f"| {_fmt(s.seconds)} | {s.env_steps} | {_fmt(s.steps_per_s)} | {_fmt(s.updates_per_s)} |"
        )
    if rows:
        lines += ["", "## Speedup", "", "| actors | seconds to target | speedup (time) | env steps/s | "
                  "speedup (steps/s) | ideal |", "|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['actors']} | {_fmt(r['seconds_to_target'])} | {_fmt(r['speedup_time'], '.2f')} "
                         f"| {_fmt(r['steps_per_s'])} | {_fmt(r['speedup_steps'], '.2f')} "
                         f"| {_fmt(r['ideal'], '.1f')} |")
    lines += ["", "## Figures", ""]
    lines += [f"![{Path(f).stem}]({f})" for f in figures]
    lines += ["", "Staleness: `evaluator` is the learner's newest version minus the version the evaluator last",
              "scored; `actors` (when recorded) is the mean over actors of `rlfleet_weights_staleness`, the",
              "versions an actor jumped at its last weights sync.", ""]
    return "\n".join(lines)


def run_targets(runs: Sequence[Run], target: float | None) -> tuple[list[float | None], str]:
    """Each run's target and a note on where they came from: ``target`` (--target) for every run, else
    the run's own (--until-return, from run.json), else its env's reward_threshold."""
    if target is not None:
        return [target] * len(runs), f"{target:g} (--target)"
    out: list[float | None] = []
    notes: list[str] = []
    for r in runs:
        if r.target is not None:
            out.append(r.target)
            notes.append(f"{r.target:g} (the run's --until-return)")
        else:
            out.append(default_target(r.env_id))
            notes.append("none" if out[-1] is None else f"{out[-1]:g} ({r.env_id}'s reward_threshold)")
    return out, ", ".join(dict.fromkeys(notes))


def write_report(run_dirs: Sequence[str | Path], out: str | Path, target: float | None = None) -> Path:
    """Every figure and report.md for ``run_dirs`` into ``out``; returns the report.md path.

    RunError if a directory is not a run or has no evaluations yet."""
    runs = [load_run(d) for d in run_dirs]
    targets, note = run_targets(runs, target)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plot_returns(runs, "env_steps", out / FIGURES[0], targets)
    plot_returns(runs, "wall_s", out / FIGURES[1], targets)
    plot_throughput(runs, out / FIGURES[2])
    plot_replay_staleness(runs, out / FIGURES[3])
    figures = list(FIGURES)
    summaries = [summarize(r, t) for r, t in zip(runs, targets, strict=True)]
    rows = speedups(summaries)
    if rows:
        plot_speedup(rows, out / "speedup.png", targets[0])
        figures.append("speedup.png")
    path = out / "report.md"
    path.write_text(markdown(summaries, figures, rows, note))
    return path


@click.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "out", default=None, help="output directory (default: RUN_DIR/report for one run, "
              "./report for several)")
@click.option("--target", type=float, default=None,
              help="eval return target of every run (default: each run's own --until-return, else its env's "
                   "reward_threshold)")
def report(run_dirs: tuple[str, ...], out: str | None, target: float | None) -> None:
    """PNG figures and a Markdown page with all of them (report.md) of one or several runs."""
    if out is None:
        out = str(Path(run_dirs[0]) / "report") if len(run_dirs) == 1 else "report"
    try:
        path = write_report(run_dirs, out, target)
    except RunError as exc:
        click.echo(f"rlfleet report: {exc}", err=True)
        sys.exit(2)
    click.echo(f"report: {path}")
    for name in sorted(p.name for p in path.parent.glob("*.png")):
        click.echo(f"  {path.parent / name}")
