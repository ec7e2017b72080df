"""bench.learning.publish_overlap end to end, shortened: a real shard process, every side publishes every due
version (the background side's outcomes all acked), and the JSON line carries each side's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_bench_runs_every_side_and_publishes_every_due_version() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.learning.publish_overlap", "--rounds", "3", "--updates", "40",
                          "--every", "10", "--batch", "32", "--hidden", "32"],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    line = json.loads(out.stdout.strip().splitlines()[-1])
    [model] = line["models"]
    assert model["hidden"] == 32 and model["params"] > 0
    assert model["none_publishes_per_round"] == 0
    assert model["inline_publishes_per_round"] == 4  # 40 updates, a version every 10
    assert 1 <= model["background_publishes_per_round"] <= 4  # newest wins: a due version may wait for the thread
    for side in ("none", "inline", "background"):
        assert model[f"{side}_updates_per_s"] > 0
    assert line["background_over_none"] == model["background_over_none"] > 0
