"""rlfleet report on a run directory written by the fleet's own writers, with no fleet running.

run.json by cli/runstart.py as the launcher writes it, progress.csv by the launcher's FleetView scraping
real /metrics servers, episodes/actor-0.csv by the actors' EpisodeLog, config.yaml by the config's dump;
evaluations.csv rows in the evaluator's columns at chosen Unix times.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from matplotlib.lines import Line2D

from harness.fleet_helpers import CONFIGS
from rlfleet.cli import runstart
from rlfleet.cli.fleetview import FleetView
from rlfleet.cli.report import FIGURES, draw_returns, new_figure, write_report
from rlfleet.cli.rundata import TRAINING_WINDOW, load_run, summarize, trailing_mean
from rlfleet.common import config as config_mod
from rlfleet.common.config import dump
from rlfleet.common.metrics import MetricsServer, ServiceMetrics
from rlfleet.services.actor.episodes import EpisodeLog

# services/actor/evaluator.py's columns
EVALUATOR_COLUMNS = "wall_time,env_steps,version,mean_return,std_return,episodes,seconds\n"


@dataclass
class Member:
    name: str
    label: str
    server: MetricsServer

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"


class Services:
    """An actor, a learner and an evaluator as /metrics servers whose figures the test sets."""

    def __init__(self) -> None:
        self.actor, self.learner, self.evaluator = (ServiceMetrics(n) for n in ("actor", "learner", "evaluator"))
        self.steps = self.actor.counter("env_steps", "")
        self.updates = self.learner.counter("learner_updates", "")
        self.version = self.learner.gauge("learner_version", "")
        self.evals = self.evaluator.counter("evaluations", "")
        self.eval_return = self.evaluator.gauge("eval_return", "")
        self.eval_version = self.evaluator.gauge("eval_version", "")
        self.members = [Member(m.service, m.service, MetricsServer(m, lambda: {"ok": True}, "127.0.0.1").start())
                        for m in (self.actor, self.learner, self.evaluator)]

    def close(self) -> None:
        for m in self.members:
            m.server.close()


STARTED = 5.0  # the run's command started this many seconds before the test writes its episodes
READY = 2.5  # wall_s when the fleet was healthy


def _data(line: Line2D, axis: str) -> list[float]:
    return [float(v) for v in np.asarray(line.get_xdata() if axis == "x" else line.get_ydata())]


def make_run(run_dir: Path, evaluations: list[tuple[float, float, int, float]], until_return: float | None,
             actors: int = 2) -> float:
    """A finished-looking run: progress rows at wall 3..12 s (1,000 env steps a second after 2 s),
    ``evaluations`` as (wall_s, env_steps or NaN, version, mean), three training episodes now. Returns
    the run's started_at."""
    cfg = config_mod.load(CONFIGS / "cartpole-dqn.yaml", [f"actor.count={actors}"])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump(cfg))
    started_at = round(time.time() - STARTED, 3)  # as the evaluator writes Unix times
    record = runstart.begin(run_dir, started_at, until_return, None, 60.0)
    record.ready_s = READY
    runstart.write(run_dir, record)
    services = Services()
    view = FleetView(services.members, run_dir / "progress.csv", live=False, lines=False)
    try:
        shown = 0
        for wall in range(3, 13):
            services.steps.inc(1000)
            services.updates.inc(50)
            services.version.set(wall)
            done = [e for e in evaluations if e[0] <= wall]
            if len(done) > shown:
                shown = len(done)
                services.evals.inc()
                services.eval_return.set(done[-1][3])
                services.eval_version.set(done[-1][2])
            view.update(float(wall))
    finally:
        view.close()
        services.close()
    rows = [f"{started_at + w:.3f},{'' if np.isnan(s) else int(s)},{v},{m},1.5,5,0.4\n" for w, s, v, m in evaluations]
    (run_dir / "evaluations.csv").write_text(EVALUATOR_COLUMNS + "".join(rows))
    log = EpisodeLog(run_dir / "episodes" / "actor-0.csv")
    log.write(2400, 1, [10.0, 20.0])
    log.write(2500, 1, [30.0])
    log.close()
    return started_at


def test_one_evaluation_is_a_marked_point_on_axes_from_zero(tmp_path: Path) -> None:
    make_run(tmp_path / "run", [(6.0, 4000, 4, 42.0)], until_return=None)
    run = load_run(tmp_path / "run")
    for x, at in (("env_steps", 4000.0), ("wall_s", 6.0)):
        fig, (ax,) = new_figure()
        draw_returns(ax, [run], x, [None])
        evals = [ln for ln in ax.get_lines() if ln.get_label().endswith(": evaluations")]
        assert len(evals) == 1 and evals[0].get_marker() == "o"
        assert _data(evals[0], "x") == pytest.approx([at], abs=1e-3) and _data(evals[0], "y") == [42.0]
        assert ax.get_xlim()[0] == 0
    assert evals[0].get_label() == "cartpole-dqn: dqn, async, 2 actors: evaluations"


def test_clock_target_training_returns_and_the_table_agree_with_the_curves(tmp_path: Path) -> None:
    # v5 reaches 150 at 7 s without an env-step count of its own: its env steps come from progress.csv
    evaluations = [(4.0, 1500, 2, 20.0), (7.0, np.nan, 5, 150.0), (10.5, 8200, 8, 180.0)]
    started_at = make_run(tmp_path / "cartpole-1", evaluations, until_return=140.0)
    run = load_run(tmp_path / "cartpole-1")
    assert run.target == 140.0 and run.ready_s == READY
    # evaluations on the command's clock: their Unix time minus the command's start
    assert list(run.evals["wall_s"]) == pytest.approx([4.0, 7.0, 10.5], abs=1e-3)
    assert list(run.evals["env_steps"]) == pytest.approx([1500, 5000, 8200])
    # training episodes: written STARTED s after the start, at the fleet's env steps of that moment
    ep = run.episodes
    assert list(ep["return"]) == [10.0, 20.0, 30.0]
    wall = time.time() - started_at
    assert STARTED - 0.1 <= ep["wall_s"][0] <= ep["wall_s"][-1] <= wall
    walls = [0.0, *range(3, 13)]  # progress.csv's rows, from 0 env steps at the start
    assert list(ep["env_steps"]) == pytest.approx(list(np.interp(ep["wall_s"], walls, [0, *range(1000, 10001, 1000)])))

    s = summarize(run, run.target)
    assert (s.seconds_to_target, s.env_steps_to_target) == (pytest.approx(7.0, abs=1e-3), 5000)
    assert s.training_return == 20.0 and s.ready_s == READY

    fig, (ax,) = new_figure()
    draw_returns(ax, [run], "env_steps", [run.target])
    lines: list[Line2D] = ax.get_lines()
    star = next(ln for ln in lines if ln.get_marker() == "*")
    assert (_data(star, "x"), _data(star, "y")) == ([s.env_steps_to_target], [150.0])
    target = next(ln for ln in lines if ln.get_label() == "target 140")
    assert _data(target, "y") == [140.0, 140.0]
    training = next(ln for ln in lines if "training episodes" in str(ln.get_label()))
    assert _data(training, "y") == list(trailing_mean(np.array([10.0, 20.0, 30.0]), TRAINING_WINDOW))
    assert _data(training, "x") == list(ep["env_steps"])

    md = write_report([tmp_path / "cartpole-1"], tmp_path / "report").read_text()
    assert "140 (the run's --until-return)" in md
    row = next(ln for ln in md.splitlines() if ln.startswith(f"| {run.name} "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:6] == [run.name, "cartpole-dqn", "dqn", "async", "2", "140"]
    assert cells[10:13] == ["7.0", "5000", "2.5"]  # seconds and env steps to target, start-up
    # the page has every figure written
    pngs = sorted(p.name for p in (tmp_path / "report").glob("*.png"))
    assert pngs == sorted(FIGURES) and sorted(re.findall(r"\]\(([^)]+\.png)\)", md)) == pngs


def test_overlays_are_labelled_by_config_and_each_run_keeps_its_own_target(tmp_path: Path) -> None:
    make_run(tmp_path / "a", [(5.0, 3000, 3, 100.0)], until_return=90.0, actors=1)
    make_run(tmp_path / "b", [(5.0, 3000, 3, 100.0)], until_return=120.0, actors=2)
    runs = [load_run(tmp_path / "a"), load_run(tmp_path / "b")]
    fig, (ax,) = new_figure()
    draw_returns(ax, runs, "wall_s", [90.0, 120.0])
    labels = [str(ln.get_label()) for ln in ax.get_lines()]
    assert "cartpole-dqn: dqn, async, 1 actor: target 90" in labels
    assert "cartpole-dqn: dqn, async, 2 actors: target 120" in labels
    md = write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "report").read_text()
    assert "90 (the run's --until-return), 120 (the run's --until-return)" in md
    assert "speedup.png" in md and (tmp_path / "report" / "speedup.png").is_file()


def test_a_resumed_runs_clock_goes_on_from_where_it_stopped(tmp_path: Path) -> None:
    first = runstart.begin(tmp_path, 1000.0, 475.0, None, None)
    assert first.clock == [[1000.0, 0.0]]
    later = runstart.begin(tmp_path, 5000.0, 500.0, None, None, resumed_wall_s=120.0)
    assert later.started_at == 1000.0 and later.until_return == 500.0
    assert list(later.wall_s(np.array([1010.0, 5000.0, 5030.0]))) == [10.0, 120.0, 150.0]
    assert runstart.read(tmp_path) == later


def test_a_serial_run_is_refused_with_the_reason(tmp_path: Path) -> None:
    from rlfleet.cli.rundata import RunError

    (tmp_path / "config.yaml").write_text(dump(config_mod.load(CONFIGS / "cartpole-dqn.yaml", [])))
    (tmp_path / "result.json").write_text("{}\n")
    with pytest.raises(RunError, match=r"serial run \(rlfleet train --serial\).*no progress.csv"):
        load_run(tmp_path)


def test_env_steps_during_start_up_are_the_actors_own_counts() -> None:
    """progress.csv starts once every service is healthy; the actors stepped before that."""
    from rlfleet.cli.rundata import ActorEpisodes, FleetSteps

    progress = {"wall_s": np.array([9.7, 10.7]), "env_steps": np.array([5232.0, 5832.0])}
    actors = [ActorEpisodes(np.array([8.6, 8.7]), np.array([44.0, 76.0]), np.array([11.0, 19.0])),
              ActorEpisodes(np.array([8.65]), np.array([30.0]), np.array([9.0]))]
    steps = FleetSteps(progress, actors)
    assert list(steps(np.array([1.0, 8.6, 8.66, 8.8, 9.7, 10.2]))) == [0, 44, 74, 106, 5232, 5532]
    # without episode files: a straight line from 0 at the command's start
    assert list(FleetSteps(progress)(np.array([0.0, 4.85]))) == [0, 2616]
