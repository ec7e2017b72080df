"""The Python API (rlfleet/): docs/python_api.md's examples run as written, budgets cut short; a
KeyboardInterrupt stops the fleet in order and leaves the caller's signal handlers as they were."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness.fleet_helpers import ROOT, tagged, wait_for
from rlfleet import Run

DOC = ROOT / "docs" / "python_api.md"
BUDGET = re.compile(r"max_env_steps=[\d_]+")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_docs_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 3, "docs/python_api.md lost its examples"
    code = "\n".join(blocks)
    # a short run: no target, 6,000 env steps, an evaluation every 2,000
    code, cut = BUDGET.subn("max_env_steps=6_000", code.replace("until_return=475, ", ""))
    assert cut >= 2, "the examples no longer give train a max_env_steps budget"
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLFLEET_EVALUATOR__EVERY_STEPS", "2000")
    namespace: dict[str, object] = {}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 (the docs' own examples)
    run = namespace["run"]
    assert isinstance(run, Run)
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == 2  # the quickstart's fleet run and the serial one, each in its own directory
    assert run.ending.how == "budget"
    assert run.evaluations, "a 6,000-step serial run with an evaluation every 2,000 has some"


# Ctrl-C raises KeyboardInterrupt in an interactive Python or a notebook; a script started as a background
# job (a CI runner's `cmd &`) inherits SIGINT ignored and Python then installs no handler, so the script
# sets the interactive one first
SCRIPT = """
import json, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import rlfleet
before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
run = rlfleet.train(sys.argv[1], max_seconds=900, runs=sys.argv[2], progress=False)
after = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
print(json.dumps({"how": run.ending.how, "detail": run.ending.detail, "handlers_kept": before == after,
                  "run_dir": str(run.run_dir)}))
"""


def test_a_keyboard_interrupt_stops_the_fleet_and_returns_the_run(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(ROOT / "configs" / "cartpole-dqn.yaml"),
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RLFLEET_TEST_TAG": tag}, cwd=ROOT)
    try:
        # training: progress.csv has a row once every member answered /healthz
        def training() -> bool:
            rows = [p for p in tmp_path.glob("*/progress.csv") if len(p.read_text().splitlines()) > 2]
            return bool(rows)
        wait_for(training, 300, "the fleet to train (progress.csv rows)")
        assert len(tagged(tag)) > 3  # the script, its zygotes and the members
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["how"] == "stopped" and "KeyboardInterrupt" in result["detail"]
    assert result["handlers_kept"]
    ending = json.loads((Path(result["run_dir"]) / "ending.json").read_text())
    assert ending["how"] == "stopped"
    deadline = time.monotonic() + 30
    while tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert tagged(tag) == [], "members outlived the interrupted train()"
