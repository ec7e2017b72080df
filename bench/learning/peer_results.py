"""The races against the distributed peers on the results page: each race's last JSON line, kept as a file.

``bench.learning.time_to_solve --peer ... --docs`` and ``bench.learning.pixels --peer sample-factory --docs``
write docs/results/peers-NAME.json (the command, the date, the machine's cores and the bench's JSON line);
``bench.learning.suite`` (also ``--report-only``) renders every such file into docs/results.md's section
"Against the distributed peers".
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
PEER_NAMES = {"sb3": "SB3", "sample_factory": "Sample Factory", "rllib": "RLlib"}


def save_race(name: str, module: str, result: dict[str, Any], results: Path = RESULTS) -> Path:
    """Keep ``result`` (the JSON line of bench ``module``) as results/peers-NAME.json with how it was made."""
    path = results / f"peers-{name}.json"
    record = {"command": f".venv/bin/python -m {module} {shlex.join(sys.argv[1:])}",
              "date": time.strftime("%Y-%m-%d"), "cores": len(os.sched_getaffinity(0)), "result": result}
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _seconds(block: dict[str, Any]) -> str:
    return "–" if block.get("median_wall_s") is None else f"{block['median_wall_s']:.1f}"


def solve_rows(name: str, record: dict[str, Any]) -> list[str]:
    """One row per peer of a time-to-solve race."""
    r = record["result"]
    ours = r["rlfleet"]
    rows = []
    for key, label in PEER_NAMES.items():
        peer = r.get(key)
        if not isinstance(peer, dict):
            continue
        ratio = r.get(f"ratio_{key}")
        unsolved = r.get(f"ratio_{key}_unsolved", 0)
        note = f" ({unsolved} peer run{'s' if unsolved != 1 else ''} unsolved, at its budget)" if unsolved else ""
        rows.append(f"| {r['algo'].upper()} {r['env']} | {ours['solved']}/{ours['runs']} | {_seconds(ours)} | "
                    f"{label} | {peer['solved']}/{peer['runs']} | {_seconds(peer)} | "
                    f"{'–' if ratio is None else f'{ratio:.3f}'}{note} | {record['date']} |")
    return rows


def section(results: Path = RESULTS) -> list[str]:
    """docs/results.md's lines for every peers-*.json (none: no lines)."""
    files = sorted(results.glob("peers-*.json"))
    if not files:
        return []
    solve: list[tuple[Path, dict[str, Any]]] = []
    pixels: list[tuple[Path, dict[str, Any]]] = []
    for path in files:
        record = json.loads(path.read_text())
        (pixels if "frames_per_s" in record["result"] else solve).append((path, record))
    lines: list[str] = []
    if solve:
        lines += ["Time to solve, same seeds and budget, the same greedy evaluation applied to every side "
                  "(docs/benchmarks.md, \"The distributed peers\", gives each peer's settings). The ratio is "
                  "rlfleet's median wall seconds over its solved runs against the peer's median over all of its "
                  "runs, an unsolved peer run counted at the wall time of its budget.", "",
                  "| race | rlfleet solved | rlfleet median wall s | peer | peer solved | peer median wall s | "
                  "ratio | date |", "|---|---|---:|---|---|---:|---|---|"]
        for path, record in solve:
            lines += solve_rows(path.stem, record)
        lines += ["", "Commands: " + "; ".join(f"`{record['command']}` ([{path.name}]({results.name}/{path.name}))"
                                               for path, record in solve), ""]
    for path, record in pixels:
        r = record["result"]
        counts = sorted(r["frames_per_s"]["rlfleet_ppo"], key=int)
        lines += [f"Pong env frames/s against Sample Factory APPO at the same number of env processes "
                  f"({r['seconds']:g} s a side, steady part; `{record['command']}`, {record['date']}, "
                  f"{record['cores']} cores; [{path.name}]({results.name}/{path.name})):", "",
                  "| side | " + " | ".join(f"{n} actor{'s' if n != '1' else ''}" for n in counts) + " |",
                  "|---|" + "---:|" * len(counts)]
        for side, values in r["frames_per_s"].items():
            lines.append(f"| {side} | " + " | ".join(f"{values[n]:,.0f}" for n in counts) + " |")
        for key in (k for k in r if k.startswith("ratio_") and isinstance(r[k], dict)):
            lines.append(f"| {key} (over the faster Sample Factory) | "
                         + " | ".join(f"{r[key][n]:.2f}" for n in counts) + " |")
        lines.append("")
    return lines
