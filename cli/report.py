"""`rlfleet report RUN_DIR [RUN_DIR ...]`: figures and a Markdown summary of one or several runs.

Figures (PNG, FIG_SIZE pixels each), runs overlaid and labelled "N actors, sync":

- ``eval_return_vs_steps.png`` / ``eval_return_vs_time.png``: greedy evaluation mean
  return (band: +- std over the evaluation's episodes) against env steps and wall seconds;
- ``throughput.png``: env steps/s and learner updates/s over time (5 s moving average);
- ``replay_staleness.png``: replay size, and weights staleness in versions (see
  :func:`cli.rundata.staleness`);
- ``speedup.png`` (runs with two actor counts or more): time to target of the fewest
  actors divided by the time of N, and the same for env steps/s, beside the ideal N/N0.

``report.md`` beside them has every run's figures (:class:`cli.rundata.Summary`).
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

from cli.rundata import Run, RunError, Summary, default_target, load_run, staleness, summarize

FIG_SIZE = (960, 600)  # pixels of every figure
_DPI = 100

FIGURES = ("eval_return_vs_steps.png", "eval_return_vs_time.png", "throughput.png", "replay_staleness.png")


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure(rows: int = 1):  # type: ignore[no-untyped-def]
    plt = _plt()
    fig, axes = plt.subplots(rows, 1, figsize=(FIG_SIZE[0] / _DPI, FIG_SIZE[1] / _DPI), dpi=_DPI, sharex=True,
                             squeeze=False)
    return fig, list(axes[:, 0])


def _save(fig, path: Path) -> None:  # type: ignore[no-untyped-def]
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)  # no bbox_inches="tight": every figure keeps FIG_SIZE
    _plt().close(fig)


def _labels(runs: Sequence[Run]) -> list[str]:
    """'N actors, sync', with the run's name added where two runs would share a label."""
    base = [r.label for r in runs]
    return [f"{b} ({r.name})" if base.count(b) > 1 else b for b, r in zip(base, runs, strict=True)]


def _smooth(values: np.ndarray, window: int = 5) -> np.ndarray:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    csum = np.cumsum(np.concatenate([[0.0], values]))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(0, idx - window)
    return (csum[idx] - csum[lo]) / (idx - lo)


def plot_eval(runs: Sequence[Run], x: str, path: Path, target: float | None) -> None:
    fig, (ax,) = _figure()
    for run, label in zip(runs, _labels(runs), strict=True):
        if not run.has_evals:
            continue
        e = run.evals
        order = np.argsort(e[x], kind="stable")
        xs, mean, std = e[x][order], e["mean"][order], e["std"][order]
        (line,) = ax.plot(xs, mean, label=label, lw=1.6)
        ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.15, lw=0)
    if target is not None:
        ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:g}")
    ax.set_xlabel("env steps" if x == "env_steps" else "wall seconds")
    ax.set_ylabel("eval mean return (greedy)")
    ax.set_title(f"Evaluation return against {'env steps' if x == 'env_steps' else 'wall time'}")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    _save(fig, path)


def plot_throughput(runs: Sequence[Run], path: Path) -> None:
    fig, (top, bottom) = _figure(2)
    for run, label in zip(runs, _labels(runs), strict=True):
        p = {k: v[1:] for k, v in run.progress.items()}  # the first row has no rate yet
        top.plot(p["wall_s"], _smooth(p["env_steps_per_s"]), label=label, lw=1.4)
        bottom.plot(p["wall_s"], _smooth(p["updates_per_s"]), label=label, lw=1.4)
    top.set_ylabel("env steps / s")
    bottom.set_ylabel("learner updates / s")
    bottom.set_xlabel("wall seconds")
    top.set_title("Throughput (5 s moving average)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(loc="best", fontsize=9)
    _save(fig, path)


def plot_replay_staleness(runs: Sequence[Run], path: Path) -> None:
    fig, (top, bottom) = _figure(2)
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
    fig, (ax,) = _figure()
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
             target: float | None) -> str:
    tgt = "none" if target is None else f"{target:g}"
    lines = [
        "# rlfleet report", "",
        f"Target eval return: {tgt}. Time and env steps to target: the first progress.csv row whose eval",
        "return reached it (what `rlfleet up --until-return` stops on; within the 1 s scrape). Steps/s and",
        "updates/s: means over progress.csv. Returns: greedy evaluations from evaluations.csv.", "",
        "| run | actors | sync | evaluations | final return | best return | seconds to target | "
        "env steps to target | seconds | env steps | env steps/s | updates/s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.run} | {s.actors} | {s.sync} | {s.evaluations} | {_fmt(s.final_return)} | {_fmt(s.best_return)} "
            f"| {_fmt(s.seconds_to_target)} | {_fmt(s.env_steps_to_target, 'd')} | {_fmt(s.seconds)} "
            f"| {s.env_steps} | {_fmt(s.steps_per_s)} | {_fmt(s.updates_per_s)} |"
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


def write_report(run_dirs: Sequence[str | Path], out: str | Path, target: float | None = None) -> Path:
    """Every figure and report.md for ``run_dirs`` into ``out``; returns the report.md path.

    RunError if a directory is not a run or has no evaluations yet."""
    runs = [load_run(d) for d in run_dirs]
    if target is None:
        target = default_target(runs[0].env_id)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plot_eval(runs, "env_steps", out / FIGURES[0], target)
    plot_eval(runs, "wall_s", out / FIGURES[1], target)
    plot_throughput(runs, out / FIGURES[2])
    plot_replay_staleness(runs, out / FIGURES[3])
    figures = list(FIGURES)
    summaries = [summarize(r, target) for r in runs]
    rows = speedups(summaries)
    if rows:
        plot_speedup(rows, out / "speedup.png", target)
        figures.append("speedup.png")
    path = out / "report.md"
    path.write_text(markdown(summaries, figures, rows, target))
    return path


@click.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "out", default=None, help="output directory (default: RUN_DIR/report for one run, "
              "./report for several)")
@click.option("--target", type=float, default=None, help="eval return target (default: the env's reward_threshold)")
def report(run_dirs: tuple[str, ...], out: str | None, target: float | None) -> None:
    """PNG figures and a Markdown summary (report.md) of one or several runs."""
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
