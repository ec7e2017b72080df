"""Following the published world model and its gate: what planners and the learner both do.

The modeler publishes the model under :data:`~rlfleet.common.config.planning.PLANNING_MODEL`
with its validation error (``meta.val_error``). The gate is open while that
error is below ``planning.gate``: planners make imagined data and the learner
samples it only then. Before any model is published the gate is closed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import gymnasium as gym

from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.config import Experiment
from rlfleet.common.config.planning import PLANNING_MODEL
from rlfleet.common.planning.dynamics import DynamicsNet, ModelMismatch, load_dynamics_model, make_dynamics_model
from rlfleet.common.wire.errors import CommTimeout, RemoteError

log = logging.getLogger("rlfleet.planning")

AWAY_BACKOFF_S = 4.0  # after a poll that got no answer: the learner must not stall on every poll


class ModelWatch:
    def __init__(self, cfg: Experiment, sender: str, obs_space: gym.Space[Any], act_space: gym.Space[Any],
                 curve: Any = None, every_s: float = 1.0) -> None:
        self.gate = cfg.planning.gate
        self.net: DynamicsNet = make_dynamics_model(cfg.planning.model, obs_space, act_space)
        self.net.eval()
        self.reader = WeightsReader(cfg.network.paramserver, sender, curve=curve, timeout_s=cfg.network.timeout_s,
                                    model=PLANNING_MODEL)
        self.every_s = every_s
        self.version = -1
        self.val_error = float("inf")
        self._asked = float("-inf")
        self._mismatch_logged = False

    @property
    def open(self) -> bool:
        """Imagined data may be made and used: a model is held and its validation error is below the gate."""
        return self.version >= 0 and self.val_error < self.gate

    def refresh(self, timeout_s: float = 2.0, force: bool = False) -> bool:
        """Ask for a newer model (at most every ``every_s`` unless ``force``); True if one was loaded."""
        now = time.monotonic()
        if not force and now - self._asked < self.every_s:
            return False
        self._asked = now
        was_open = self.open
        try:
            got = self.reader.get(self.version, timeout_s=timeout_s)
        except (CommTimeout, RemoteError) as exc:  # the paramserver is away: ask again only after a while
            log.debug("world model poll failed: %s", exc)
            self._asked = now + AWAY_BACKOFF_S
            return False
        if got is None:
            return False
        version, arrays = got
        try:
            val_error = load_dynamics_model(self.net, arrays)
        except ModelMismatch as exc:
            if not self._mismatch_logged:  # e.g. a modeler of another experiment on this paramserver
                log.error("%s; ignoring world model version %d", exc, version)
                self._mismatch_logged = True
            return False
        self.version, self.val_error = version, val_error
        if self.open != was_open:
            log.info("world model v%d: validation error %.4g, gate %g: imagined data %s", version, val_error,
                     self.gate, "on" if self.open else "off")
        return True

    def close(self) -> None:
        self.reader.close()
