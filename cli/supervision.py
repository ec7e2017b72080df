"""What `rlfleet up` does when a member dies mid-run: compose's ``restart: on-failure``, with a crash-loop bound.

A member that exits with an error or is killed by a signal (an OOM kill, a
``kill -9``) is started again with the same command and log, as compose's
restart policy and Swarm's do for the containers: every service restarts from
its own state (replay's snapshot and log, the learner's checkpoint, the
paramserver's version on disk) and its peers reconnect. A member that exits
0 was not asked to (the launcher stops members itself), and one that died
``limit`` times within ``window_s`` is in a crash loop: both end the run with
its log. ``--restart no`` ends the run at the first death.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque

POLICIES = ("on-failure", "no")


class RestartPolicy:
    """Decides whether a member that exited is started again; remembers when each one was."""

    def __init__(self, policy: str = "on-failure", limit: int = 5, window_s: float = 300.0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"restart policy {policy!r}; allowed: {', '.join(POLICIES)}")
        self.policy = policy
        self.limit = limit
        self.window_s = window_s
        self._times: dict[str, deque[float]] = defaultdict(deque)

    def refusal(self, label: str, code: int, now: float | None = None) -> str | None:
        """None: restart ``label`` (its restart is counted); else why the run ends instead."""
        if self.policy == "no":
            return "restart policy 'no' (rlfleet up --restart on-failure starts it again)"
        if code == 0:
            return "it exited 0 without being asked to stop"
        now = time.monotonic() if now is None else now
        times = self._times[label]
        while times and now - times[0] > self.window_s:
            times.popleft()
        if len(times) >= self.limit:
            return f"it died {len(times) + 1} times within {self.window_s:.0f} s (a crash loop)"
        times.append(now)
        return None

    def restarts(self, label: str) -> int:
        """Restarts of ``label`` within the window."""
        return len(self._times.get(label, ()))
