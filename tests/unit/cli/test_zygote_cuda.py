"""The fork servers and CUDA (issue 39, item 6).

A forked child cannot use CUDA once its parent initialised it, so nothing the zygotes preload may
initialise CUDA, or probe it at import (``torch.cuda.is_available()`` and its kin): the guard
imports every module of both preload lists in a fresh interpreter, in the zygotes' order, with
``CUDA_VISIBLE_DEVICES`` unset, and checks ``torch.cuda.is_initialized()`` and which code called
torch.cuda's probes during the imports (a profile hook watching the calls: nothing is patched). On
this CPU torch ``is_initialized`` cannot turn true, the watched calls can. And a learner that may
train on CUDA is not forked at all: the launcher starts it as a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.fleet_helpers import CONFIGS, ROOT
from rlfleet.cli.forkserver import ForkedProcess, ForkServers, gpu_visible, needs_fresh_process
from rlfleet.cli.launcher import Fleet, make_run_dir, plan
from rlfleet.cli.zygote import PRELOAD
from rlfleet.common import config as config_mod

PROBES = ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_properties",
          "is_bf16_supported", "get_device_name", "set_device")
GUARD = r"""
import importlib, json, os, sys

PROBES = set(json.loads(sys.argv[1]))
CUDA_INIT = os.path.join("torch", "cuda", "__init__.py")
called = []

def watch(frame, event, arg):
    if event == "call" and frame.f_code.co_name in PROBES and frame.f_code.co_filename.endswith(CUDA_INIT):
        caller = frame.f_back
        called.append([frame.f_code.co_name, caller.f_code.co_filename if caller else "?"])

sys.setprofile(watch)
for module in json.loads(sys.argv[2]):
    importlib.import_module(module)
sys.setprofile(None)
import torch
print(json.dumps({"initialized": torch.cuda.is_initialized(), "called": called,
                  "torch": "torch" in sys.modules}))
"""


def test_no_preloaded_module_initialises_or_probes_cuda() -> None:
    modules = list(dict.fromkeys([*PRELOAD["light"], *PRELOAD["heavy"]]))
    assert "torch" in modules and any(m.startswith("rlfleet.services.learner") for m in modules)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.run([sys.executable, "-c", GUARD, json.dumps(PROBES), json.dumps(modules)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["torch"]
    assert out["initialized"] is False
    assert out["called"] == [], f"torch.cuda probed while the zygotes' preload imported: {out['called']}"


def test_the_guard_sees_a_probe_at_import(tmp_path: Path) -> None:
    """What the guard would report: a module calling torch.cuda.is_available() at import."""
    (tmp_path / "probes_at_import.py").write_text("import torch\nHERE = torch.cuda.is_available()\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-c", GUARD, json.dumps(PROBES), json.dumps(["torch", "probes_at_import"])],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    called = json.loads(proc.stdout.strip().splitlines()[-1])["called"]
    assert ["is_available", str(tmp_path / "probes_at_import.py")] in called


def test_which_members_start_fresh() -> None:
    assert needs_fresh_process("learner", "cuda", gpu=False)  # asked for: fresh even where it will fail to find one
    assert needs_fresh_process("learner", "cuda:1", gpu=False)
    assert needs_fresh_process("learner", "auto", gpu=True)
    assert not needs_fresh_process("learner", "auto", gpu=False)  # auto on a host without a GPU: CPU, forked
    assert not needs_fresh_process("learner", "cpu", gpu=True)
    for service in ("replay", "paramserver", "actor", "evaluator", "modeler", "planner"):
        assert not needs_fresh_process(service, "cuda", gpu=True)


def test_a_gpu_is_visible_by_its_device_node_unless_hidden(tmp_path: Path) -> None:
    assert not gpu_visible({}, tmp_path)
    (tmp_path / "nvidiactl").touch()  # the control node alone is no GPU
    assert not gpu_visible({}, tmp_path)
    (tmp_path / "nvidia0").touch()
    assert gpu_visible({}, tmp_path)
    assert gpu_visible({"CUDA_VISIBLE_DEVICES": "0"}, tmp_path)
    assert not gpu_visible({"CUDA_VISIBLE_DEVICES": ""}, tmp_path)
    assert not gpu_visible({"CUDA_VISIBLE_DEVICES": "-1"}, tmp_path)


def test_the_launcher_starts_a_cuda_learner_fresh_and_forks_the_rest(tmp_path: Path) -> None:
    """Real zygotes; the learner asked for CUDA starts as a fresh interpreter (here it then exits: this
    torch has no CUDA), the paramserver beside it is forked."""
    cfg = config_mod.load(CONFIGS / "cartpole-dqn.yaml", environ={}, sets=["learner.device=cuda",
                                                                           "evaluator.enabled=false"])
    run_dir = make_run_dir(cfg, str(tmp_path))
    cfg, members = plan(cfg, 1, run_dir, inproc=False)
    fleet = Fleet(cfg, members, run_dir, inproc=False, forkservers=ForkServers())
    by = {m.name: m for m in reversed(members)}  # the first of each service
    for m in members:
        m.log_path = run_dir / "logs" / f"{m.label}.log"  # as Fleet.start sets it
    try:
        fleet._start_process(by["learner"])
        fleet._start_process(by["paramserver"])
        assert isinstance(by["learner"].proc, subprocess.Popen), by["learner"].proc
        assert isinstance(by["paramserver"].proc, ForkedProcess), by["paramserver"].proc
        assert by["learner"].proc.wait(300) != 0  # no CUDA here: the learner says so and exits
        log = (run_dir / "logs" / "learner.log").read_text()
        assert "forked by the" not in log and "CUDA" in log, log[-2000:]
    finally:
        fleet.stop()
        deadline = time.monotonic() + 30
        while any(m.exit_code() is None for m in members if m.proc is not None) and time.monotonic() < deadline:
            time.sleep(0.5)

