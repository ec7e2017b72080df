"""A member of a local fleet stops when the launcher that started it is gone.

`rlfleet up` (and `rlfleet.train`) starts every member in a session of its own, so that Ctrl-C in the
terminal reaches only the launcher, which then stops the fleet in order. A launcher that cannot do that
(SIGKILL, the OOM killer, a notebook kernel that died) would leave its members training on their own,
holding ports and CPU, forever. So the launcher names itself to each member in ``RLFLEET_LAUNCHER``
(its pid and its start time, which together name one process even after the pid is reused), and a
member that finds that process gone stops as on SIGTERM: checkpoints and snapshots are written as on any
clean stop. A service started any other way (containers, `rlfleet service` by hand) has no such
variable and no watch.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

log = logging.getLogger("rlfleet.launcher_watch")

ENV = "RLFLEET_LAUNCHER"
EVERY_S = 1.0


def proc_stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat after the command name (state is [0], ppid [1], session [3], start time [19]);
    None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def identity(pid: int | None = None) -> str:
    """``PID:START``: a process, by its pid and its start time (clock ticks after boot)."""
    pid = os.getpid() if pid is None else pid
    fields = proc_stat(pid)
    return f"{pid}:{fields[19] if fields is not None else ''}"


def alive(named: str) -> bool:
    """Whether the process ``named`` (an :func:`identity`) still runs: neither gone, nor a zombie, nor its
    pid taken by another process."""
    pid, _, start = named.partition(":")
    fields = proc_stat(pid)
    if fields is None:
        return False
    return fields[0] not in ("Z", "X") and (not start or fields[19] == start)


class LauncherWatch:
    """A daemon thread that calls ``on_gone`` once, when the launcher ``named`` is no longer alive."""

    def __init__(self, named: str, on_gone: Callable[[], None], every_s: float = EVERY_S) -> None:
        self.named = named
        self.on_gone = on_gone
        self.every_s = every_s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="launcher-watch", daemon=True)

    def start(self) -> LauncherWatch:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            if not alive(self.named):
                log.warning("the launcher that started this process (pid %s) is gone: stopping as on SIGTERM",
                            self.named.partition(":")[0])
                self.on_gone()
                return


def watch_launcher(on_gone: Callable[[], None], environ: Mapping[str, str] = os.environ,
                   every_s: float = EVERY_S) -> LauncherWatch | None:
    """Watch the launcher named in ``environ`` (none named: no watch, None)."""
    named = environ.get(ENV)
    if not named or not os.path.isdir("/proc"):
        return None
    return LauncherWatch(named, on_gone, every_s).start()
