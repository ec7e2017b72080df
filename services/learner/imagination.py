"""Parallel Dyna-Q on the learner's side: which batches come from the planners' imagined table.

While the world model's gate is open (common/planning/model_watch.py), a
fraction ``planning.imagined_ratio`` of the learner's batches are whole batches
of the imagined table, interleaved evenly with real ones (a running credit, so
the ratio holds over any window of batches, not only on average); while it is
closed, or no imagined batch is ready, the learner takes a real batch: the
update is never lost. Real batches keep the real table's rate limiter in
charge of the learner's pace, so every imagined batch is an update on top of
what real experience allows: the point of Dyna.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlfleet.common.clients.replay_sample import SampleBatch, SampleClient
from rlfleet.common.config import Experiment
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.planning.model_watch import ModelWatch
from rlfleet.common.security import client_curve
from rlfleet.common.wire.errors import CommTimeout, RemoteError

IMAGINED_WAIT_S = 0.05  # how long a due imagined batch is waited for before a real one goes instead
MAX_CREDIT = 2.0  # imagined batches owed at most (missed ones are made up, but never in a long burst)


class ImaginedMix:
    def __init__(self, cfg: Experiment, batch_items: int, obs_space: gym.Space[Any], act_space: gym.Space[Any],
                 metrics: ServiceMetrics) -> None:
        self.ratio = cfg.planning.imagined_ratio
        curve = client_curve(cfg, "learner")
        self.sampler = SampleClient(cfg.network.replay, "learner", cfg.planning.table, batch_items,
                                    in_flight=cfg.learner.samples_in_flight, seed=cfg.seed + 1, curve=curve)
        self.model = ModelWatch(cfg, "learner", obs_space, act_space, curve=curve)
        self.credit = 0.0
        m = metrics
        self.m_sampled = m.counter("learner_sampled_items", "Items the learner trained on, by source table kind"
                                   " (real, imagined).", ("source",))
        for source in ("real", "imagined"):
            self.m_sampled.labels(source).inc(0)
        self.m_gate = m.gauge("learner_gate_open", "1 while the world model's gate lets imagined data in.")
        self.m_val = m.gauge("learner_model_val_error", "Validation error of the newest world model seen.")
        self.m_val.set(float("inf"))

    def due(self) -> bool:
        """Is the next batch an imagined one? (Advances the credit; the gate is checked first.)"""
        if self.model.refresh(timeout_s=0.25):  # at most once a second: the gauges change only then
            self.m_gate.set(float(self.model.open))
            self.m_val.set(self.model.val_error)
        if not self.model.open:
            self.credit = 0.0
            return False
        self.credit += self.ratio
        if self.credit >= 1.0:
            self.credit -= 1.0
            return True
        return False

    def take(self) -> SampleBatch | None:
        """A due imagined batch, or None if none is ready (then it stays due: at most one more)."""
        try:
            return self.sampler.sample(timeout_s=IMAGINED_WAIT_S)
        except (CommTimeout, RemoteError):
            self.credit = min(self.credit + 1.0, MAX_CREDIT)
            return None

    def count(self, source: str, rows: int) -> None:
        self.m_sampled.labels(source).inc(rows)

    def close(self) -> None:
        self.sampler.close()
        self.model.close()
