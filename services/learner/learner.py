"""The learner: samples from every replay shard, trains, publishes versioned weights.

Async protocol: trains continuously (the replay rate limiter keeps the ratio
of learning to acting) and publishes every ``learner.publish_every`` updates.
Barrier protocol: for round k it waits at the paramserver's barrier until
every live actor has finished acting on version k, does
``learner.updates_per_round`` updates (none while replay is below its min
size) and publishes version k + 1.

Sample requests are kept in flight by the SampleClient, so a batch is usually
waiting when an update ends; priorities go back without waiting. In a barrier
round only that round's batches are asked for (``SampleClient.ask_for``): a
request sent ahead across the barrier could reach replay before or after the
next round's inserts, and a fixed seed would no longer give the same run. Checkpoints
(model, target, optimizer, counters, version, config) are written atomically
every ``learner.checkpoint_every_s`` and on stop, and resumed on start.

Faults: a restarted learner resumes from its checkpoint and publishes a
version newer than any the paramserver holds (asked with ``info``, not by
fetching the weights). Every ``REPUBLISH_CHECK_S`` the
learner asks each paramserver shard which versions it holds; a shard that
lost them (it restarted) gets the current version again at once, so actors
that (re)start meanwhile need not wait for the next update or round. While
replay is away the learner waits (no batch, no update) and resumes when it
answers again.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import algorithms
from common.algorithms.checkpoint import load_checkpoint, save_checkpoint
from common.clients.replay_sample import SampleBatch, SampleClient
from common.clients.version_probe import VersionProbe
from common.clients.weights_publisher import WeightsPublisher
from common.config import Experiment, dump
from common.envs import probe_env
from common.metrics import ServiceMetrics
from common.runtime import FatalError, StartupError
from common.security import client_curve, refused_hint
from common.tboard import ScalarWriter
from common.wire.errors import CommTimeout, RemoteError
from services.learner.round_order import concat_in_canonical_order

log = logging.getLogger("rlfleet.learner")

CHECKPOINT = "checkpoint.pt"
REPUBLISH_CHECK_S = 1.0  # how often the learner checks that every paramserver shard holds its version
STALENESS_SAMPLES = 64  # items of a batch observed in rlfleet_learner_item_staleness (evenly spaced)


def checkpoint_path(cfg: Experiment) -> Path:
    return Path(cfg.run_dir) / cfg.learner.dir / CHECKPOINT


class LearnerService:
    def __init__(self, cfg: Experiment) -> None:
        self.cfg = cfg
        self._stopping = False
        torch.set_num_threads(cfg.learner.torch_threads)
        obs_space, act_space = probe_env(cfg)
        self.algo = algorithms.get(cfg.algorithm.name)
        self.core = self.algo.make_learner(
            cfg.algorithm, obs_space, act_space, device=cfg.learner.device, seed=cfg.seed
        )
        self.metrics = ServiceMetrics("learner", 0)
        self._define_metrics()
        self.version = 0
        self.ckpt = checkpoint_path(cfg)
        state = load_checkpoint(self.ckpt)
        if state is not None:
            if "core" not in state or "version" not in state:
                raise StartupError(f"{self.ckpt} is not an rlfleet learner checkpoint")
            self.core.load_state(state["core"])
            self.version = int(state["version"])
            log.info("learner: resumed from %s at update %d, version %d", self.ckpt, self.core.num_updates,
                     self.version)
        self.sampler = SampleClient.from_config(cfg, "learner", batch_size=self.core.data.batch_items)
        self.tb = ScalarWriter(cfg.run_dir, "learner")  # RUN_DIR/tensorboard/learner; a no-op without tensorboard
        self._tb_last = 0.0
        self.published: dict[str, Any] = {}  # arrays of self.version, checkpointed for `rlfleet eval`
        # one paramserver client: publishes, barriers and version probes share its connections
        self.publisher = WeightsPublisher(cfg.network.paramserver, "learner", curve=client_curve(cfg, "learner"))
        self.table = next(t for t in cfg.replay.tables if t.name == cfg.learner.table)
        self.last_ckpt = time.monotonic()
        self.probe = VersionProbe(self.publisher.shards, every_s=REPUBLISH_CHECK_S,
                                  timeout_s=min(5.0, cfg.network.timeout_s))
        self._ps_failing = False
        self._replay_reconnects = 0
        self.m_updates.inc(self.core.num_updates)
        # Ask the paramserver before /metrics is up: a learner killed after publishing a version newer
        # than its checkpoint must not show the checkpoint's (older) version while it starts.
        self.start_version = self.first_version()
        self.m_version.set(max(self.version, self.start_version - 1))
        log.info("learner: %s on %s, %s protocol", cfg.algorithm.name, self.core.device, cfg.sync)

    def _define_metrics(self) -> None:
        m = self.metrics
        self.m_updates = m.counter("learner_updates", "Gradient updates done (continues across restarts).")
        self.m_loss = m.gauge("learner_loss", "Loss of the last update.")
        self.m_stats = m.gauge("learner_stat", "The algorithm's figures of its last update (q_mean, entropy, ...).",
                               ("stat",))
        self.m_staleness = m.histogram(
            "learner_item_staleness", "Versions between the weights an item was acted with and the learner's.",
            buckets=(0, 1, 2, 4, 8, 16, 32, 64))
        self.m_dropped = m.counter("learner_items_dropped", "Items not trained on, by reason (stale: acted with"
                                   " weights more than the algorithm's max_staleness versions old).", ("reason",))
        self.m_dropped.labels("stale").inc(0)
        self.m_version = m.gauge("learner_version", "Newest weights version published.")
        self.m_publishes = m.counter("learner_publishes", "Weights versions published.")
        self.m_wait = m.counter("learner_sample_wait_seconds", "Seconds the learner waited for a batch.")
        self.m_barrier = m.counter("learner_barrier_wait_seconds", "Seconds the learner waited at barriers.")
        self.m_ups = m.gauge("learner_updates_per_second", "Updates per second over the last 10 s.")
        self.m_ckpt = m.counter("learner_checkpoints", "Checkpoints written.")
        self.m_republish = m.counter("learner_republishes",
                                     "Current weights sent again to a paramserver shard that had lost them.")
        self.m_reconnects = m.counter("reconnects", "Connections re-established to a peer that had gone.", ("peer",))
        for peer in ("replay", "paramserver"):
            self.m_reconnects.labels(peer).inc(0)
        self._rate = (time.monotonic(), self.core.num_updates)

    # -- publish / checkpoint ---------------------------------------------------
    def publish(self, version: int, retry: bool = True) -> bool:
        """Publish ``version``; True once every shard acked it.

        With ``retry`` it tries until the paramserver acks (barrier: nobody can
        act before the next version anyway). Without, one try: async training
        goes on while the paramserver is away (the actors act on the weights
        they hold), and :meth:`ensure_published` publishes once it is back.
        """
        weights = self.core.weights()
        while True:
            try:
                self.publisher.publish(version, weights, timeout_s=self.cfg.network.timeout_s)
                break
            except CommTimeout:
                self._ps_failing = True
                if self._stopping or not retry:
                    log.warning("learner: paramserver did not ack version %d; training on", version)
                    return False
                log.warning("learner: paramserver did not ack version %d; retrying", version)
            except RemoteError as exc:
                if exc.reason != "stale_version":
                    raise FatalError(f"paramserver refused version {version}: {exc}") from None
                # The paramserver holds a newer version than ours (it outlived a learner
                # that published further than our checkpoint): continue after it.
                version = self.first_version()
                log.warning("learner: paramserver holds newer weights; publishing as version %d", version)
        self._paramserver_answered()
        self.version = version
        self.m_version.set(version)
        self.m_publishes.inc()
        self.published = weights
        return True

    def _paramserver_answered(self) -> None:
        if self._ps_failing:
            self._ps_failing = False
            self.m_reconnects.labels("paramserver").inc()
            log.info("learner: paramserver answers again")

    def ensure_published(self) -> None:
        """Is every paramserver shard there and holding our version? If not, publish (never blocks).

        A shard that lost our version (it restarted) gets it again at once, so
        actors that (re)start meanwhile need not wait for the next update or
        round. Async publishes a new version with the current weights; barrier
        sends the same version again (a new one would skip a round).
        """
        outcome, held, asked_at = self.probe.step(self.version)
        if outcome == "silent":
            self._ps_failing = True
        if outcome != "answered" or not self.published:
            return
        was_away = self._ps_failing
        self._paramserver_answered()
        if min(held) >= asked_at and not was_away:  # (a version published since may not be in the answer)
            return
        log.warning("learner: paramserver shards hold versions %s, ours is %d: publishing", held, self.version)
        if self.cfg.sync == "async":
            if self.publish(self.version + 1, retry=False):
                self.m_republish.inc()
            return
        try:
            self.publisher.publish(self.version, self.published, timeout_s=self.cfg.network.timeout_s)
        except CommTimeout:
            self._ps_failing = True
            return
        except RemoteError as exc:  # e.g. stale_version: a newer learner got there first; nothing to restore
            log.warning("learner: republishing version %d refused: %s", self.version, exc)
            return
        self.m_republish.inc()

    def first_version(self) -> int:
        """Continue after whatever the paramserver holds (a restarted learner never goes back).

        Asked with ``info`` (the versions each shard holds), not by fetching the
        weights; the newest version any shard holds counts, since a shard
        refuses a version that is not newer than its own (``stale_version``).
        """
        try:
            held = max(self.probe.newest(self.cfg.network.timeout_s))
        except (CommTimeout, RemoteError) as exc:
            raise StartupError(
                f"paramserver at {self.cfg.network.paramserver} did not answer within "
                f"{self.cfg.network.timeout_s:g} s (network.paramserver): {exc}{refused_hint(self.cfg, 'learner')}"
            ) from None
        return max(self.version, held + 1) if held >= 0 else self.version

    def checkpoint(self) -> None:
        state: dict[str, Any] = {"core": self.core.state(), "version": self.version, "config": dump(self.cfg)}
        if self.published:  # the exact arrays actors and the evaluator got as `version`
            state["weights"] = {k: torch.from_numpy(v) for k, v in self.published.items()}
        save_checkpoint(self.ckpt, state)
        self.last_ckpt = time.monotonic()
        self.m_ckpt.inc()

    def _maybe_checkpoint(self) -> None:
        if time.monotonic() - self.last_ckpt >= self.cfg.learner.checkpoint_every_s:
            self.checkpoint()

    # -- updates ------------------------------------------------------------------
    def take_batch(self, timeout_s: float) -> SampleBatch | None:
        """One sampled batch (None if none came within timeout_s); waits and reconnects counted."""
        start = time.monotonic()
        try:
            batch = self.sampler.sample(beta=self.core.beta(), timeout_s=timeout_s)
        except CommTimeout:
            batch = None
        self.m_wait.inc(time.monotonic() - start)
        if self.sampler.reconnects > self._replay_reconnects:
            self.m_reconnects.labels("replay").inc(self.sampler.reconnects - self._replay_reconnects)
            self._replay_reconnects = self.sampler.reconnects
        return batch

    def learn(self, data: dict[str, np.ndarray], weights: np.ndarray | None = None,
              batch: SampleBatch | None = None) -> bool:
        """Drop stale items, learn on the rest, send priorities back to ``batch``'s shard; False if all were stale."""
        behind = self.version - np.asarray(data["version"]).reshape(-1) if "version" in data else None
        if behind is not None and len(behind):
            step = max(1, len(behind) // STALENESS_SAMPLES)  # a big batch: evenly spaced items, not all
            for b in behind[::step]:
                self.m_staleness.observe(b)
        kept, dropped = algorithms.drop_stale(data, self.version, self.core.data.max_staleness)
        if dropped:
            self.m_dropped.labels("stale").inc(dropped)
            if dropped == len(next(iter(data.values()))):
                return False
            if weights is not None and behind is not None:  # importance weights follow the items kept
                weights = np.asarray(weights)[behind <= (self.core.data.max_staleness or 0)]
        before = self.core.num_updates
        figures, priorities = self.core.learn(kept, weights)
        if priorities is not None and batch is not None and not dropped:  # (keys and priorities must match)
            self.sampler.update_priorities(batch, priorities)
        self.m_updates.inc(self.core.num_updates - before)
        self.m_loss.set(figures.get("loss", float("nan")))
        for name, value in figures.items():
            self.m_stats.labels(name).set(value)
        if time.monotonic() - self._tb_last >= 1.0:  # TensorBoard: once a second is plenty
            self._tb_last = time.monotonic()
            self.tb.add_many({**{f"learner/{k}": v for k, v in figures.items()}, "learner/version": self.version},
                             step=self.core.num_updates)
        now = time.monotonic()
        if now - self._rate[0] >= 10.0:
            self.m_ups.set((self.core.num_updates - self._rate[1]) / (now - self._rate[0]))
            self._rate = (now, self.core.num_updates)
        return True

    def update_once(self, timeout_s: float) -> bool:
        """One learn call on one sampled batch; False if no batch came within timeout_s (or all was stale)."""
        batch = self.take_batch(timeout_s)
        return batch is not None and self.learn(batch.data, batch.weights, batch)

    def run(self) -> None:
        self.publish(self.start_version)
        log.info("learner: published version %d", self.version)
        if self.cfg.sync == "async":
            self._run_async()
        else:
            self._run_barrier()

    def _run_async(self) -> None:
        every = self.cfg.learner.publish_every
        published_at = self.core.num_updates
        while not self._stopping:
            # one learn call may take many optimizer steps (PPO: epochs x minibatches): publish when it
            # crossed a multiple of publish_every
            if (self.update_once(timeout_s=0.5) and self.core.num_updates // every > published_at // every
                    and not self._ps_failing):
                published_at = self.core.num_updates
                self.publish(self.version + 1, retry=False)
            self._maybe_checkpoint()
            self.ensure_published()

    def _replay_ready(self) -> bool:
        """Some shard at or above the table's min size: it serves while the others hold samples.

        (With fewer actors than shards some shards stay empty: requiring all would stall.)
        The sizes come with every batch (``table_size``), and tables do not shrink: once a
        shard is known to be at its min size no shard is asked. Only until then (start-up,
        or after a round that got no batch: replay restarted) is each shard asked ``info``.
        """
        if any(s.size >= self.table.min_size for s in self.sampler.shards):
            return True
        for shard in range(len(self.cfg.network.replay)):
            try:
                stats = self.sampler.info(shard, timeout_s=self.cfg.network.timeout_s)
            except CommTimeout:
                continue
            if stats["tables"][self.table.name]["size"] >= self.table.min_size:
                return True
        return False

    def _run_barrier(self) -> None:
        while not self._stopping:
            start = time.monotonic()
            try:
                actors = self.publisher.barrier(self.version, timeout_s=1.0)
            except CommTimeout:
                self.m_barrier.inc(time.monotonic() - start)
                self._maybe_checkpoint()
                self.ensure_published()
                continue
            self.m_barrier.inc(time.monotonic() - start)
            done = self._segments_round(actors) if self.core.data.round == "segments" else self._updates_round()
            if self._stopping:
                break
            self.publish(self.version + 1)
            log.debug("learner: round %d: %d actors, %d updates", self.version - 1, actors, done)
            self._maybe_checkpoint()

    def _updates_round(self) -> int:
        """A round of ``learner.updates_per_round`` learn calls, each on a fresh batch (DQN)."""
        want = self.cfg.learner.updates_per_round
        done = 0
        if not self._replay_ready():
            return done
        self.sampler.ask_for(want)  # every batch of the round asked for after its inserts
        # A round has a deadline: replay restarting mid-round must not hold every actor forever.
        deadline = time.monotonic() + self.cfg.network.timeout_s
        while done < want and not self._stopping and time.monotonic() < deadline:
            if self.update_once(timeout_s=1.0):
                done += 1
                deadline = time.monotonic() + self.cfg.network.timeout_s
        if done == 0:
            self.sampler.forget_sizes()  # e.g. replay restarted empty: ask it again next round
        if done < want and not self._stopping:
            log.warning("learner: round %d ended after %d of %d updates: no batch for %.0f s",
                        self.version, done, want, self.cfg.network.timeout_s)
        return done

    def _segments_round(self, actors: int) -> int:
        """Every item of the round once, in one learn call (PPO): each of ``actors`` actors inserted
        ``num_envs * steps_per_round / item_steps`` items acted with this version."""
        want = actors * self.cfg.env.num_envs * self.cfg.actor.steps_per_round // self.core.data.item_steps
        per_batch = self.core.data.batch_items
        self.sampler.ask_for(-(-want // per_batch))
        parts: list[dict[str, np.ndarray]] = []
        got = 0
        deadline = time.monotonic() + self.cfg.network.timeout_s
        while got < want and not self._stopping and time.monotonic() < deadline:
            batch = self.take_batch(timeout_s=1.0)
            if batch is None:
                if self.sampler.wanted == 0:  # a queue answered short: ask for the rest
                    self.sampler.ask_for(-(-(want - got) // per_batch))
                continue
            parts.append(batch.data)
            got += len(batch.keys)
            deadline = time.monotonic() + self.cfg.network.timeout_s
        if got < want and not self._stopping:
            log.warning("learner: round %d got %d of its %d items within %.0f s", self.version, got, want,
                        self.cfg.network.timeout_s)
        # in an order that arrival does not decide (same seeds, same weights: services/learner/round_order.py)
        return 1 if parts and self.learn(concat_in_canonical_order(parts)) else 0

    # -- service contract ---------------------------------------------------------
    def stop(self) -> None:
        self._stopping = True

    def health(self) -> dict[str, Any]:
        return {"ok": not self._stopping, "updates": self.core.num_updates, "version": self.version,
                "device": str(self.core.device)}

    def close(self) -> None:
        try:
            self.checkpoint()
            log.info("learner: checkpoint at update %d, version %d -> %s", self.core.num_updates, self.version,
                     self.ckpt)
        finally:
            self.sampler.close()
            self.publisher.close()
            self.tb.close()
