"""The modeler: parallel Dyna-Q's model learner.

It samples the learner's real table (samples the rate limiter neither holds nor
counts: the Q-learner's samples-per-insert budget is untouched), trains the
dynamics model (common/planning/dynamics.py) on every item but the held-out
split, and publishes it to the paramserver under its model name (``PLANNING_MODEL``) every
``planning.model.publish_every`` updates, with its validation error, which
planners and the learner read as the gate. At most
``planning.model.updates_per_s`` updates a second: the model needs far fewer
than the Q-network, and the cores are shared.

Faults: it checkpoints every ``planning.model.checkpoint_every_s`` and on stop
and resumes from it; a paramserver that restarted gets the model at the next
publish; a paramserver holding a newer version (it outlived a modeler that got
further than its checkpoint) is continued after.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from rlfleet.common.algorithms.checkpoint import load_checkpoint, save_checkpoint
from rlfleet.common.algorithms.device_choice import DriverTooOld, choose_device, probe_cuda
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.config import Experiment
from rlfleet.common.config.planning import PLANNING_MODEL
from rlfleet.common.envs import probe_env
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.planning.dynamics import DynamicsLearner, ModelMismatch
from rlfleet.common.runtime import FatalError, StartupError
from rlfleet.common.security import client_curve
from rlfleet.common.wire.errors import CommTimeout, RemoteError

log = logging.getLogger("rlfleet.modeler")

CHECKPOINT = "modeler/checkpoint.pt"


class ModelerService:
    def __init__(self, cfg: Experiment) -> None:
        self.cfg = cfg
        self._stopping = False
        mc = cfg.planning.model
        torch.set_num_threads(mc.torch_threads)
        obs_space, act_space = probe_env(cfg)
        try:
            device = choose_device(cfg.learner.device, probe_cuda, lambda: sum(p.numel() for p in DynamicsLearner(
                mc, obs_space, act_space, device="cpu", seed=cfg.seed).net.parameters()))
            self.core = DynamicsLearner(mc, obs_space, act_space, device=device.device, seed=cfg.seed)
        except ModelMismatch as exc:
            raise StartupError(f"planning.enabled with env.id={cfg.env.id!r}: {exc}") from None
        except (DriverTooOld, ValueError) as exc:
            raise StartupError(f"{exc} (learner.device={cfg.learner.device})") from None
        log.info("modeler: trains on %s (%s): %s", device.device, device.reason, device.detail)
        self.version = 0
        self.ckpt = Path(cfg.run_dir) / CHECKPOINT
        state = load_checkpoint(self.ckpt)
        if state is not None:
            self.core.load_state(state["core"])
            self.version = int(state["version"]) + 1
            log.info("modeler: resumed from %s at update %d", self.ckpt, self.core.num_updates)
        curve = client_curve(cfg, "modeler")
        self.sampler = SampleClient(cfg.network.replay, "modeler", cfg.learner.table, mc.batch_size, in_flight=1,
                                    seed=cfg.seed, curve=curve, rate_limited=False)
        self.publisher = WeightsPublisher(cfg.network.paramserver, "modeler", curve=curve, model=PLANNING_MODEL)
        self.reader = WeightsReader(cfg.network.paramserver, "modeler", curve=curve, model=PLANNING_MODEL,
                                    timeout_s=cfg.network.timeout_s)
        if state is None:
            self.start_from_fleet()
        self.metrics = ServiceMetrics("modeler", 0)
        m = self.metrics
        self.m_updates = m.counter("modeler_updates", "World model updates (continues across restarts).")
        self.m_updates.inc(self.core.num_updates)
        self.m_loss = m.gauge("modeler_loss", "Training loss of the last update.")
        self.m_val = m.gauge("modeler_val_error", "Validation error on the held-out split (the gate's input).")
        self.m_gate = m.gauge("modeler_gate_open", "1 while the validation error is below planning.gate.")
        self.m_version = m.gauge("modeler_version", "Newest world model version published.")
        self.m_publishes = m.counter("modeler_publishes", "World model versions published.")
        self.m_val.set(self.core.val_error)
        self.m_version.set(-1)
        self.last_ckpt = time.monotonic()
        self._published_at = self.core.num_updates
        log.info("modeler: world model %s on %s, trained on table %r (%.0f%% held out), gate %g",
                 list(mc.hidden), self.core.device, cfg.learner.table, 100 * mc.holdout, cfg.planning.gate)

    def start_from_fleet(self) -> None:
        """No checkpoint (killed before its first, or moved to a node whose volume never held it): take the
        world model the paramserver holds, so that a restart goes on from the fleet's model instead of
        publishing a fresh one over it. Nothing published yet: a fresh model, version 0."""
        cfg = self.cfg
        try:
            got = self.reader.get(-1, timeout_s=cfg.network.timeout_s)
        except (CommTimeout, RemoteError) as exc:
            raise StartupError(f"modeler: paramserver at {cfg.network.paramserver} did not give the world model it "
                               f"holds within {cfg.network.timeout_s:g} s (network.paramserver): {exc}") from None
        if got is None:
            return
        version, weights = got
        try:
            self.core.load_weights(weights)
        except ValueError as exc:
            raise StartupError(f"modeler: paramserver at {cfg.network.paramserver} holds world model version "
                               f"{version} of another network ({exc}): a paramserver of another experiment? Point "
                               "network.paramserver at this experiment's, or restart it empty") from None
        self.version = version + 1
        log.warning("modeler: no checkpoint; starting from the fleet's world model version %d (validation error "
                    "%.4g), its optimizer fresh", version, self.core.val_error)

    def publish(self) -> None:
        weights = self.core.weights()
        for _ in range(2):
            try:
                self.publisher.publish(self.version, weights, timeout_s=self.cfg.network.timeout_s)
            except CommTimeout:
                log.warning("modeler: paramserver did not ack world model version %d; training on", self.version)
                return
            except RemoteError as exc:
                if exc.reason != "stale_version":
                    raise FatalError(f"paramserver refused world model version {self.version}: {exc}") from None
                held = self._held_version()
                log.warning("modeler: paramserver holds world model version %d; continuing after it", held)
                self.version = held + 1
                continue
            self.m_version.set(self.version)
            self.m_publishes.inc()
            self.version += 1
            return

    def _held_version(self) -> int:
        try:
            got = self.reader.get(-1, timeout_s=self.cfg.network.timeout_s)
        except (CommTimeout, RemoteError):
            return self.version
        return self.version if got is None else got[0]

    def checkpoint(self) -> None:
        save_checkpoint(self.ckpt, {"core": self.core.state(), "version": self.version - 1})
        self.last_ckpt = time.monotonic()

    def run(self) -> None:
        mc = self.cfg.planning.model
        period = 0.0 if mc.updates_per_s is None else 1.0 / mc.updates_per_s
        next_at = time.monotonic()
        while not self._stopping:
            wait = next_at - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, 0.5))
                continue
            try:
                batch = self.sampler.sample(timeout_s=0.5)
            except CommTimeout:
                batch = None
            except RemoteError as exc:
                log.warning("modeler: replay refused a sample: %s", exc)
                time.sleep(0.5)
                continue
            if batch is not None:
                next_at = max(next_at + period, time.monotonic() - 1.0)
                self._learn(batch.data, batch.keys)
            if time.monotonic() - self.last_ckpt >= mc.checkpoint_every_s:
                self.checkpoint()

    def _learn(self, data: dict[str, Any], keys: Any) -> None:
        try:
            figures = self.core.learn(data, keys)
        except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as exc:
            log.warning("modeler: skipped a batch it cannot learn from: %s: %s", type(exc).__name__, exc)
            return
        self.m_updates.inc()
        if "loss" in figures:
            self.m_loss.set(figures["loss"])
        self.m_val.set(self.core.val_error)
        self.m_gate.set(float(self.core.val_error < self.cfg.planning.gate))
        if self.core.num_updates - self._published_at >= self.cfg.planning.model.publish_every:
            self._published_at = self.core.num_updates
            self.publish()

    def stop(self) -> None:
        self._stopping = True

    def health(self) -> dict[str, Any]:
        return {"ok": not self._stopping, "updates": self.core.num_updates, "val_error": self.core.val_error,
                "version": self.version - 1, "gate_open": self.core.val_error < self.cfg.planning.gate}

    def close(self) -> None:
        try:
            self.checkpoint()
        finally:
            self.sampler.close()
            self.publisher.close()
            self.reader.close()
