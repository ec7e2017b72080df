"""Shard 0's env-step table on disk, so that the fleet's env-step count survives a paramserver restart.

The registry counts the fleet's env steps from what actors report (their own totals; a smaller one is a
restart). That count drives what runs on env steps: the evaluator's ``every_steps`` and the env steps of
its evaluations, a learner's schedules when it starts without a checkpoint, the actors' exploration.
Held only in memory, it started again from 0 with every restart of shard 0 and with ``rlfleet up
--resume``, and the evaluations of a resumed run were numbered from 0 again. :class:`StepCountsFile`
writes the table (:meth:`Registry.step_counts`: each actor id's last total and what it counted before
its restarts) atomically every ``every_s`` seconds while it changes and when the shard stops, and the
shard restores it at start: actors that kept running report the totals it holds (nothing is counted
twice), actors that restarted report less (counted as a restart, as before).
"""

from __future__ import annotations

import json
import logging
import os
import time

from rlfleet.services.paramserver.registry import Registry

log = logging.getLogger(__name__)

FILE = "env-steps.json"  # beside the shard's checkpoints, RUN_DIR/paramserver/
EVERY_S = 10.0


class StepCountsFile:
    """``path`` (None: nothing is kept) holds ``registry``'s env-step table."""

    def __init__(self, path: str | None, registry: Registry, every_s: float = EVERY_S) -> None:
        self.path = path
        self.registry = registry
        self.every_s = every_s
        self._written = registry.step_changes  # the registry's step_changes at the last write (none: as now)
        self._next = 0.0

    def restore(self) -> None:
        """The table the file holds, if any; a file that cannot be read as one is logged and left as it is
        (the count starts at 0, as with none)."""
        if self.path is None or not os.path.exists(self.path):
            return
        try:
            with open(self.path, encoding="utf-8") as f:
                self.registry.restore_step_counts(json.load(f))
        except (OSError, ValueError) as exc:
            log.error("paramserver: %s cannot be read as the env-step table (%s); counting env steps from 0",
                      self.path, exc)
            return
        self._written = self.registry.step_changes
        log.info("paramserver: env-step count restored from %s: %d", self.path, self.registry.fleet_env_steps)

    def tick(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now >= self._next:
            self._next = now + self.every_s
            self.write()

    def write(self) -> None:
        """The table, atomically, if it changed since the last write; an OSError is logged (the count in
        memory is unharmed; the next write tries again)."""
        if self.path is None or self.registry.step_changes == self._written:
            return
        changes = self.registry.step_changes
        tmp = f"{self.path}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.registry.step_counts(), f)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("paramserver: could not write the env-step table to %s: %s", self.path, exc)
            return
        self._written = changes
