"""CPU seconds of each member of a running `rlfleet up` fleet, read from /proc (Linux).

A member's pid is the one its log's first line names (``pid N forked by the ... fork server``:
the launcher forks members from fork servers); a member restarted since has a later such
line, and the last one counts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_FORKED = re.compile(r"pid (\d+) forked by the")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def member_pids(run_dir: Path) -> dict[str, int]:
    """{member label: pid} of every member whose log names its pid."""
    pids = {}
    for log in sorted((run_dir / "logs").glob("*.log")):
        found = _FORKED.findall(log.read_text(errors="replace"))
        if found:
            pids[log.stem] = int(found[-1])
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children (0.0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # after the command: state is field 3; utime 14, stime 15, cutime 16, cstime 17 (1-based)
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK


def snapshot(run_dir: Path) -> dict[str, float]:
    """{member label: CPU seconds so far}."""
    return {label: cpu_seconds(pid) for label, pid in member_pids(run_dir).items()}
