"""rlfleet report, status and eval on one real short run (processes, real sockets), plus bad inputs.

One fleet runs for the whole module (~25 s): `rlfleet status` looks at it while it
runs; `rlfleet report` and `rlfleet eval` read what it left behind.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner, Result
from PIL import Image

from harness.fleet_helpers import CONFIGS, ROOT, read_csv
from rlfleet.cli.main import main
from rlfleet.cli.report import FIG_SIZE, FIGURES, draw_returns, new_figure, write_report
from rlfleet.cli.rundata import load_run
from rlfleet.common.wire.transport import free_tcp_port

RUN_SECONDS = 20  # from the command's start, start-up included (7-9 s on a loaded 2-core machine)
TARGET = 10_000  # the run's --until-return: out of reach, the run ends on its time budget (exit 3)
FAST = [  # small and quick: evaluations every 2 s, checkpoint at stop
    "--set", "evaluator.every_steps=null", "--set", "evaluator.every_s=1", "--set", "evaluator.episodes=5",
    "--set", "algorithm.hidden=[64,64]", "--set", "replay.tables.0.min_size=500",
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 2-actor async run of RUN_SECONDS; `rlfleet status --run` taken while it runs."""
    runs = tmp_path_factory.mktemp("runs")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlfleet.cli", "up", "--config", str(CONFIGS / "cartpole-dqn.yaml"), "--actors", "2",
         "--max-seconds", str(RUN_SECONDS), "--until-return", str(TARGET), "--runs", str(runs), *FAST],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        run_dir = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(runs.glob("*/progress.csv"))
            if found and len(found[0].read_text().splitlines()) >= 4:  # healthy and scraped a few times
                run_dir = found[0].parent
                break
            time.sleep(0.5)
        assert run_dir is not None, f"fleet did not start:\n{proc.communicate(timeout=60)[0][-3000:]}"
        status = rlfleet("status", "--run", str(run_dir), "--json", "--interval", "1", timeout=60)
        out, _ = proc.communicate(timeout=RUN_SECONDS + 120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    assert proc.returncode == 3, out[-3000:]
    return {"run_dir": run_dir, "status": status, "out": out}


def rlfleet(*args: str, timeout: float = 0) -> Result:
    """The real command, run in this process (no interpreter start-up per call); .returncode like a process."""
    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    res.returncode = res.exit_code  # type: ignore[attr-defined]
    return res


# -- status ----------------------------------------------------------------------


def test_status_of_a_running_fleet(fleet: dict[str, Any]) -> None:
    st = fleet["status"]
    assert st.returncode == 0, st.output
    rows = json.loads(st.output)
    members = json.loads((fleet["run_dir"] / "fleet.json").read_text())["members"]
    assert sorted(r["label"] for r in rows) == sorted(m["label"] for m in members)
    assert all(r["healthy"] for r in rows), rows
    by_service = {r["service"]: r for r in rows}
    assert set(by_service) == {"replay", "paramserver", "learner", "actor", "evaluator"}
    assert re.search(r"env steps \d+, \d+/s", by_service["actor"]["figures"]), by_service["actor"]
    assert "updates" in by_service["learner"]["figures"] and "size" in by_service["replay"]["figures"]


def test_status_figures_show_wal_failures_only_when_there_are_some() -> None:
    from rlfleet.cli.status import Reading, figures

    calm = Reading(reachable=True, samples={"rlfleet_replay_size": 500.0, "rlfleet_replay_wal_failures_total": 0.0})
    assert "wal failures" not in figures("replay", calm, None, 0)
    full = Reading(reachable=True, samples={"rlfleet_replay_size": 500.0, "rlfleet_replay_wal_failures_total": 7.0})
    assert figures("replay", full, None, 0) == "size 500, inserts -/s, samples -/s, wal failures 7"


def test_status_unreachable_and_bad_arguments(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_tcp_port()}"
    res = rlfleet("status", "--url", dead, "--interval", "0", timeout=60)
    assert res.returncode == 1 and "down" in res.output and "unreachable" in res.output
    res = rlfleet("status", timeout=60)
    assert res.returncode == 2 and "exactly one of" in res.output
    res = rlfleet("status", "--run", str(tmp_path), timeout=60)
    assert res.returncode == 2 and "fleet.json does not exist" in res.output


# -- report ----------------------------------------------------------------------


def _png_ok(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 0, path
    with Image.open(path) as im:
        assert im.size == FIG_SIZE, (path, im.size)
        pixels = np.asarray(im.convert("L"), np.float64)
    assert pixels.std() > 5, f"{path} looks blank"


def _table(md: str) -> list[dict[str, str]]:
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for ln in lines[1:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) == len(header) and not ln.startswith("| actors"):
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def test_report_figures_and_numbers_match_the_csvs(fleet: dict[str, Any], tmp_path: Path) -> None:
    run_dir: Path = fleet["run_dir"]
    progress = read_csv(run_dir / "progress.csv")
    evals = read_csv(run_dir / "evaluations.csv")
    assert evals, "the evaluator wrote no row in a 25 s run"
    means = [float(r["mean_return"]) for r in evals]
    target = max(means)  # reached, by construction: the first evaluation that has it is the time to target
    hit = means.index(target)
    curve = load_run(run_dir).evals  # what the figures draw
    started_at = json.loads((run_dir / "run.json").read_text())["started_at"]

    out = tmp_path / "report"
    res = rlfleet("report", str(run_dir), "--out", str(out), "--target", str(target), timeout=120)
    assert res.returncode == 0, res.output
    for name in FIGURES:
        _png_ok(out / name)
    assert not (out / "speedup.png").exists()  # one actor count: no speedup chart

    md = (out / "report.md").read_text()
    for name in FIGURES:
        assert f"]({name})" in md
    (row,) = _table(md)
    first, last = progress[0], progress[-1]
    span = float(last["wall_s"]) - float(first["wall_s"])
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert row["run"] == run_dir.name and int(row["actors"]) == cfg["actor"]["count"] == 2
    assert row["sync"] == cfg["sync"]
    assert int(row["evaluations"]) == len(evals)
    assert float(row["final return"]) == pytest.approx(means[-1], abs=0.051)
    assert float(row["best return"]) == pytest.approx(max(means), abs=0.051)
    # the table's point is the curve's: the first evaluation at the target, on the command's clock
    assert float(row["seconds to target"]) == pytest.approx(float(evals[hit]["wall_time"]) - started_at, abs=0.051)
    assert float(row["seconds to target"]) == pytest.approx(curve["wall_s"][hit], abs=0.051)
    assert int(row["env steps to target"]) == round(curve["env_steps"][hit])
    assert int(row["env steps"]) == int(last["env_steps"])
    steps_rate = (int(last["env_steps"]) - int(first["env_steps"])) / span
    updates_rate = (int(last["updates"]) - int(first["updates"])) / span
    assert float(row["env steps/s"]) == pytest.approx(steps_rate, abs=0.051)
    assert float(row["updates/s"]) == pytest.approx(updates_rate, abs=0.051)


def test_a_real_runs_report_has_its_target_and_counts_from_the_command(fleet: dict[str, Any], tmp_path: Path) -> None:
    run_dir: Path = fleet["run_dir"]
    start = json.loads((run_dir / "run.json").read_text())
    assert start["until_return"] == TARGET and start["max_seconds"] == RUN_SECONDS
    first = read_csv(run_dir / "progress.csv")[0]
    # the clock runs from the command's start: the first scrape comes after start-up, which took time
    assert 0 < start["ready_s"] <= float(first["wall_s"])
    assert json.loads((run_dir / "ending.json").read_text())["started_at"] == start["started_at"]
    md = write_report([run_dir], tmp_path / "report").read_text()
    assert f"Targets: {TARGET} (the run's --until-return)" in md
    (row,) = _table(md)
    assert row["target"] == str(TARGET) and row["seconds to target"] == "-"
    assert float(row["start-up s"]) == pytest.approx(start["ready_s"], abs=0.051)
    run = load_run(run_dir)
    assert len(run.episodes["return"]) and 0 < run.episodes["wall_s"][0]  # training episodes, on the same clock
    fig, (ax,) = new_figure()
    draw_returns(ax, [run], "wall_s", [TARGET])
    assert ax.get_xlim()[0] == 0


def test_report_speedup_chart_for_two_actor_counts(fleet: dict[str, Any], tmp_path: Path) -> None:
    """The same run's data as a second run of 4 actors: speedup 1.0 beside an ideal of 2."""
    other = tmp_path / "four-actors"
    shutil.copytree(fleet["run_dir"], other, ignore=shutil.ignore_patterns("learner", "replay", "tensorboard"))
    cfg = yaml.safe_load((other / "config.yaml").read_text())
    cfg["actor"]["count"] = 4
    (other / "config.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "report"
    res = rlfleet("report", str(fleet["run_dir"]), str(other), "--out", str(out), "--target", "0", timeout=120)
    assert res.returncode == 0, res.output
    _png_ok(out / "speedup.png")
    md = (out / "report.md").read_text()
    speed = [r for r in _table(md.split("## Speedup")[1]) if r.get("actors")]
    assert [(r["actors"], r["speedup (time)"], r["speedup (steps/s)"], r["ideal"]) for r in speed] == [
        ("2", "1.00", "1.00", "1.0"), ("4", "1.00", "1.00", "2.0")]


def test_report_refuses_what_is_not_a_run(fleet: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "junk").mkdir()
    res = rlfleet("report", str(tmp_path / "junk"), timeout=60)
    assert res.returncode == 2 and "is not a run directory" in res.output, res.output
    res = rlfleet("report", str(tmp_path / "missing"), timeout=60)
    assert res.returncode != 0

    early = tmp_path / "early"
    shutil.copytree(fleet["run_dir"], early, ignore=shutil.ignore_patterns("learner", "replay", "tensorboard"))
    lines = (early / "evaluations.csv").read_text().splitlines()
    (early / "evaluations.csv").write_text(lines[0] + "\n")
    res = rlfleet("report", str(early), "--out", str(tmp_path / "r"), timeout=60)
    assert res.returncode == 2 and "no evaluations yet" in res.output, res.output
    assert not (tmp_path / "r" / "report.md").exists()


# -- eval ------------------------------------------------------------------------


def _evaluator_score(cfg_text: str, weights: dict[str, np.ndarray], version: int, tmp: Path) -> float:
    """What the real evaluator service reports for ``weights`` published as ``version``."""
    from rlfleet.common.clients.weights_publisher import WeightsPublisher

    cfg = yaml.safe_load(cfg_text)
    ps = f"tcp://127.0.0.1:{free_tcp_port()}"
    cfg["network"]["paramserver"] = [ps]
    cfg["paramserver"]["shards"] = 1
    cfg["run_dir"] = str(tmp)
    (tmp / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = []
    try:
        for name in ("paramserver", "evaluator"):
            cmd = [sys.executable, "-m", "rlfleet.cli", "service", name, "--config", str(tmp / "config.yaml"),
                   "--set", "metrics.port=0"]
            log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        pub = WeightsPublisher([ps], "test-publisher")
        try:
            pub.publish(version, weights, timeout_s=30)
        finally:
            pub.close()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            path = tmp / "evaluations.csv"
            rows = list(csv.DictReader(open(path))) if path.exists() else []
            mine = [r for r in rows if int(r["version"]) == version]
            if mine:
                return float(mine[0]["mean_return"])
            time.sleep(0.3)
        raise AssertionError("the evaluator scored nothing: " + (tmp / "evaluator.log").read_text()[-2000:])
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)


def test_eval_matches_the_evaluator_for_the_same_weights(fleet: dict[str, Any], tmp_path: Path) -> None:
    from rlfleet.cli.evaluate import load_for_eval

    ckpt = fleet["run_dir"] / "learner" / "checkpoint.pt"
    gif = tmp_path / "episode.gif"
    res = rlfleet("eval", "--checkpoint", str(ckpt), "--video", str(gif), timeout=300)
    assert res.returncode == 0, res.output
    mean = float(re.search(r"mean (-?[\d.]+) std", res.output).group(1))  # type: ignore[union-attr]

    loaded = load_for_eval(ckpt)
    # The evaluator, as a service, scoring the very weights the command scored: same code, seeds, result.
    scored = _evaluator_score(yaml.safe_dump(loaded.cfg.model_dump(mode="json")), loaded.weights, loaded.version,
                              tmp_path)
    assert mean == pytest.approx(scored, abs=0.006)
    # And where the run's own evaluator scored this version with these exact arrays, it agrees too.
    if loaded.exact:
        same = [r for r in read_csv(fleet["run_dir"] / "evaluations.csv") if int(r["version"]) == loaded.version]
        for r in same:
            assert float(r["mean_return"]) == pytest.approx(mean, abs=0.006)

    episode_return = float(re.search(r"return (-?[\d.]+)\)", res.output).group(1))  # type: ignore[union-attr]
    with Image.open(gif) as im:
        # One frame a step (CartPole: reward 1 a step); Pillow may merge identical consecutive frames.
        assert 2 <= im.n_frames <= episode_return and im.size == (600, 400)


def test_eval_refuses_a_file_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.pt"
    bogus.write_bytes(b"not a checkpoint")
    res = rlfleet("eval", "--checkpoint", str(bogus), timeout=60)
    assert res.returncode == 2 and "cannot be read as a checkpoint" in res.output, res.output
    res = rlfleet("eval", "--checkpoint", str(tmp_path / "none.pt"), timeout=60)
    assert res.returncode == 2 and "no such file" in res.output


# -- TensorBoard -----------------------------------------------------------------


def test_learner_and_evaluator_write_tensorboard_scalars(fleet: dict[str, Any]) -> None:
    from rlfleet.common.tboard import read_scalars

    run_dir: Path = fleet["run_dir"]
    learner = read_scalars(run_dir / "tensorboard" / "learner")
    assert learner["learner/loss"] and learner["learner/version"]
    steps = [s for s, _ in learner["learner/loss"]]
    assert steps == sorted(steps) and steps[-1] > 0  # step: the learner's update count
    evaluator = read_scalars(run_dir / "tensorboard" / "evaluator")["eval/mean_return_by_version"]
    csv_means = {int(r["version"]): float(r["mean_return"]) for r in read_csv(run_dir / "evaluations.csv")}
    assert evaluator and {v: round(m, 3) for v, m in evaluator} == {v: round(csv_means[v], 3) for v, _ in evaluator}
