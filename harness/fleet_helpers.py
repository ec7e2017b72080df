"""Running `rlfleet up` and reading its run directory, for the end-to-end tests."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"


def rlfleet(*args: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would; returns the finished process (stdout+stderr in .stdout)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", *args], cwd=cwd or ROOT, env=env, timeout=timeout,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def only_run_dir(runs: Path) -> Path:
    dirs = [d for d in runs.iterdir() if d.is_dir()]
    assert len(dirs) == 1, f"expected one run directory in {runs}, found {dirs}"
    return dirs[0]


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def episodes(run_dir: Path, actor_id: str) -> list[tuple[int, int, float]]:
    """(env_steps, version, return) of every episode an actor finished."""
    rows = read_csv(run_dir / "episodes" / f"{actor_id}.csv")
    return [(int(r["env_steps"]), int(r["version"]), float(r["episode_return"])) for r in rows]


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.25) -> Any:
    """Poll predicate() until it returns something true; AssertionError naming what after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def tagged(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries RLFLEET_TEST_TAG=tag: what a test's launcher
    started (it, its fork servers and every member inherit the variable)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"RLFLEET_TEST_TAG={tag}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(int(entry.name))
    return out
