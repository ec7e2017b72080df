"""The actor as a gradient worker (A3C, HogWild): act, compute gradients, push them, pull weights.

For an algorithm that trains through workers (its Builder's ``make_worker``) there is no
replay and no learner: each actor steps its vector env with the weights it pulled, hands every
rollout the adder completes to the algorithm's ``gradients``, pushes them to the paramserver's
shards (common/clients/gradient_pusher.py), which apply them with their own optimizer, and pulls
the version its push made. A push refused as stale (the shards moved more than
``paramserver.gradients.max_staleness`` versions on meanwhile) is dropped and counted, and the
worker pulls the newest weights; so is one the worker itself cannot compute (non-finite).

Barrier (synchronous A2C): every push is part of its version's round; the shard answers once every
live worker pushed for it and applies their mean, and the worker heartbeats while it waits.

Start-up: the first worker finds no weights and publishes the model from the experiment seed
as version 0 (every worker builds the same one; a shard that already holds a version refuses
the publish with ``stale_version``, and the worker reads what is there).

A paramserver that restarted: from its checkpoint, it may hold an older version than the worker's
(pushes refused ``unknown_version``): the worker takes that version and goes on from it; with no
checkpoint it holds none (``no_weights``): the worker publishes the model it holds (every worker
holds a whole copy), the shard goes on from it with a fresh optimizer state.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.common import algorithms
from rlfleet.common.clients.gradient_pusher import RETRYABLE, GradientPusher, PushOutcome
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.config import Experiment
from rlfleet.common.envs import make_vector_env, probe_env
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.runtime import FatalError
from rlfleet.common.security import client_curve
from rlfleet.common.tboard import scalar_writer
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.services.actor.episodes import Episodes
from rlfleet.services.actor.member import FleetMember

log = logging.getLogger("rlfleet.worker")


class WorkerService(FleetMember):
    """One gradient worker: env, policy and loss, pushes to the paramserver, heartbeats."""

    def __init__(self, cfg: Experiment, actor_id: str) -> None:
        super().__init__(cfg, actor_id, "actor")
        self.algo = algorithms.get(cfg.algorithm.name)
        self.index = self.links.welcome.index
        obs_space, act_space = probe_env(cfg)
        self.worker = self.algo.make_worker(cfg.algorithm, obs_space, act_space, seed=cfg.seed,
                                            act_seed=[cfg.seed, self.index, 1])
        self.metrics = ServiceMetrics("actor", self.index)
        self._define_metrics()
        self.env_seed = cfg.seed * 100_003 + self.index * cfg.env.num_envs
        self.envs = make_vector_env(cfg.env, self.env_seed, self.algo.autoreset_mode)
        self.adder = self.algo.make_adder(cfg.algorithm, cfg.env.num_envs, obs_space, act_space,
                                          self.algo.autoreset_mode)
        # shards apply a push once per (sender, seq): this incarnation's own id, kept across reconnects
        self.sender = f"{actor_id}/{secrets.token_hex(16)}"
        curve = client_curve(cfg, "actor")
        self.pusher = GradientPusher(cfg.network.paramserver, self.sender, curve=curve, timeout_s=cfg.network.timeout_s)
        self.curve = curve
        self.version = -1
        self.env_steps = 0
        self.figures: dict[str, float] = {}
        # exploration on the fleet's env steps (the registry's count at the last heartbeat, plus ours since
        # times the live workers), as the actor's
        self._fleet = (self.links.welcome.fleet_env_steps, 0, max(1, self.links.welcome.num_actors))
        self.exploration = self.worker.explore(self.index, self._fleet[2], self._fleet[0])
        self.episodes = Episodes(self.metrics, cfg.env.num_envs, self.algo.autoreset_mode == "NextStep",
                                 Path(cfg.run_dir) / "episodes" / f"{actor_id}.csv",
                                 scalar_writer(cfg, actor_id, "worker"))
        log.info("worker %s: index %d, pushes gradients to %d paramserver shard(s), %s protocol", actor_id,
                 self.index, cfg.paramserver.shards, cfg.sync)

    def _define_metrics(self) -> None:
        m = self.metrics
        self.m_version = m.gauge("weights_version", "Weights version this actor acts with.")
        self.m_pushes = m.counter("worker_pushes", "Gradient pushes, by outcome: applied, stale, duplicate, refused.",
                                  ("outcome",))
        for outcome in ("applied", "stale", "duplicate", "refused"):
            self.m_pushes.labels(outcome)
        self.m_push_s = m.counter("worker_push_seconds", "Seconds spent pushing gradients and pulling weights.")
        self.m_grad_s = m.counter("worker_gradient_seconds", "Seconds spent computing gradients.")
        self.m_loss = m.gauge("worker_loss", "Loss of the last rollout a gradient was computed on.")

    # -- weights ----------------------------------------------------------------
    def _take(self, got: tuple[int, dict[str, np.ndarray]] | None) -> bool:
        if got is None:
            return False
        self.version, weights = got
        self.worker.load_weights(weights)
        self.m_version.set(self.version)
        return True

    def _start_weights(self) -> bool:
        """Version 0 from the experiment seed if the paramserver holds none, then the newest; False if stopped."""
        while not self._stopping:
            try:
                if self._take(self.links.reader.get(-1, timeout_s=self.cfg.network.timeout_s)):
                    return True
                self._publish(0)
            except CommTimeout as exc:
                log.warning("worker %s: waiting for the paramserver: %s", self.actor_id, exc)
                self.links.heartbeat(self.version, self.env_steps)
        return False

    def _publish(self, version: int) -> None:
        """Publish the model as this worker holds it as ``version`` (unless a worker was first)."""
        publisher = WeightsPublisher(self.cfg.network.paramserver, f"{self.actor_id}-publish", curve=self.curve)
        try:
            publisher.publish(version, self.worker.weights(), timeout_s=self.cfg.network.timeout_s)
            log.info("worker %s: published the weights it holds as version %d", self.actor_id, version)
        except RemoteError as exc:
            if exc.reason != "stale_version":  # another worker was first
                raise
        finally:
            publisher.close()

    def _recover(self, reason: str) -> None:
        """The paramserver restarted: from an older checkpoint (``unknown_version``: take its version,
        even if older), or with none (``no_weights``: give it ours, then take the newest)."""
        try:
            if reason == "no_weights":
                log.warning("worker %s: the paramserver holds no weights (restarted without a checkpoint);"
                            " publishing ours (v%d)", self.actor_id, self.version)
                self._publish(max(self.version, 0))
            self.version = -1  # accept whatever version the paramserver holds now
        except (CommTimeout, RemoteError) as exc:
            log.warning("worker %s: could not republish the weights: %s", self.actor_id, exc)

    def _pull(self) -> None:
        try:
            self._take(self.links.reader.get(self.version, timeout_s=self.cfg.network.timeout_s))
        except (CommTimeout, RemoteError) as exc:
            log.warning("worker %s: weights poll failed (%s); acting on v%d", self.actor_id, exc, self.version)

    # -- gradients ----------------------------------------------------------------
    def _learn(self, items: dict[str, np.ndarray]) -> None:
        start = time.monotonic()
        grads, figures = self.worker.gradients(items)
        if grads is None:  # nothing to push yet (a worker filling its own buffer)
            return
        pushed = time.monotonic()
        self.m_grad_s.inc(pushed - start)
        self.figures = figures
        self.m_loss.set(figures.get("loss", float("nan")))
        if not all(np.isfinite(g).all() for g in grads.values()):
            self.m_pushes.labels("refused").inc()
            log.warning("worker %s: non-finite gradients (loss %s); not pushed", self.actor_id, figures.get("loss"))
            return
        out = self._push_round(grads) if self.cfg.sync == "barrier" else self._push(grads)
        if out is not None:
            if out.applied:
                self.m_pushes.labels("applied").inc()
            elif out.duplicates:
                self.m_pushes.labels("duplicate").inc()
            for reason, detail in out.refused.values():
                if reason not in RETRYABLE:  # our gradients do not fit the model: retrying cannot help
                    raise FatalError(f"paramserver refused our gradients: {reason}: {detail}")
                if reason in ("stale_gradients", "busy"):  # busy: the round holds too many pushes in our name
                    self.m_pushes.labels("stale" if reason == "stale_gradients" else "refused").inc()
                    break
                if reason == "not_registered":  # the registry expired us: a heartbeat joins again
                    self.links.heartbeat(self.version, self.env_steps)
                    break
                self._recover(reason)
                break
        self._pull()
        self.m_push_s.inc(time.monotonic() - pushed)

    def _push(self, grads: dict[str, np.ndarray]) -> PushOutcome | None:
        try:
            return self.pusher.push(self.version, grads)
        except CommTimeout as exc:
            log.warning("worker %s: push not answered (%s); pulling weights and going on", self.actor_id, exc)
            return None

    def _push_round(self, grads: dict[str, np.ndarray]) -> PushOutcome | None:
        """Barrier: push for the round and wait until every live worker has (heartbeating meanwhile)."""
        again = False
        while not self._stopping:
            try:
                return self.pusher.push(self.version, grads, barrier=True, timeout_s=self.cfg.actor.heartbeat_s,
                                        again=again)
            except CommTimeout:
                again = True  # the shard holds it (or lost it with a restart): the same seqs again
                self.links.heartbeat(self.version, self.env_steps)
        return None

    # -- loop -------------------------------------------------------------------
    def run(self) -> None:
        cfg = self.cfg
        if not self._start_weights():
            return
        obs, _ = self.envs.reset(seed=[self.env_seed + j for j in range(cfg.env.num_envs)])  # type: ignore[arg-type]
        self.adder.reset(obs)
        last_beat = time.monotonic()
        while not self._stopping:
            actions, extras = self.worker.act(obs)
            obs, rewards, terminated, truncated, infos = self.envs.step(actions)
            items = self.adder.add(actions, extras, obs, rewards, terminated, truncated, infos, self.version)
            self.env_steps += cfg.env.num_envs
            self.episodes.step(self.env_steps, self.version, rewards, terminated, truncated)
            if len(items["version"]):
                self._learn(items)
            if time.monotonic() - last_beat >= cfg.actor.heartbeat_s:
                welcome = self.links.heartbeat(self.version, self.env_steps)
                if welcome is not None and welcome.index >= 0:
                    self.index = welcome.index
                    workers = max(1, welcome.num_actors, welcome.index + 1)
                    self._fleet = (welcome.fleet_env_steps, self.env_steps, workers)
                last_beat = time.monotonic()
            if self.env_steps % (50 * cfg.env.num_envs) == 0:  # an exploration schedule moves with the fleet's steps
                fleet, own, workers = self._fleet
                self.exploration = self.worker.explore(self.index, workers, fleet + (self.env_steps - own) * workers)

    def health(self) -> dict[str, Any]:
        return {"ok": not self._stopping, "actor_id": self.actor_id, "index": self.index, "version": self.version,
                "env_steps": self.env_steps, **self.exploration, **self.figures}

    def close(self) -> None:
        self.links.close()
        self.pusher.close()
        self.envs.close()
        self.episodes.close()
