"""The learner: samples from every replay shard, trains, publishes versioned weights.

Async protocol: trains continuously (the replay rate limiter keeps the ratio
of learning to acting) and publishes every ``learner.publish_every`` updates.
Rank 0 takes each version's snapshot on the training thread and a thread of
its own sends it (:class:`~rlfleet.services.learner.publishing.BackgroundPublisher`:
the snapshot is taken once the previous publish is done, so the paramserver
gets the newest weights); training never waits for the paramserver's acks.
Barrier protocol: for round k it waits at the paramserver's barrier until
every live actor has finished acting on version k, trains on the round as the
algorithm consumes it (``learner.updates_per_round`` updates, none while
replay is below its min size; or every item of the round once: see
:mod:`rlfleet.common.algorithms.rounds`) and publishes version k + 1.

Sample requests are kept in flight by the SampleClient, so a batch is usually
waiting when an update ends; priorities go back without waiting. In a barrier
round only that round's batches are asked for (``SampleClient.ask_for``): a
request sent ahead across the barrier could reach replay before or after the
next round's inserts, and a fixed seed would no longer give the same run. Checkpoints
(model, target, optimizer, counters, version, config) are written atomically
every ``learner.checkpoint_every_s`` and on stop, and resumed on start: the
training thread takes the snapshot, a thread of its own writes it.

Faults: a restarted learner resumes from its checkpoint and publishes a
version newer than any the paramserver holds (asked with ``info``). A learner
with no checkpoint, or one older than the paramserver's newest version, first
takes the paramserver's newest weights (:meth:`LearnerService.start_from_fleet`),
so the fleet's training is never thrown away. Every ``REPUBLISH_CHECK_S`` the
learner asks each paramserver shard which versions it holds; a shard that
lost them (it restarted) gets the current version again at once, so actors
that (re)start meanwhile need not wait for the next update or round. While
replay is away the learner waits (no batch, no update) and resumes when it
answers again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlfleet.common import algorithms
from rlfleet.common.algorithms.checkpoint import CheckpointWriter, load_checkpoint
from rlfleet.common.algorithms.data_parallel import CollectiveError, GradientAverager, broadcast_learner
from rlfleet.common.algorithms.device_choice import DeviceChoice, DriverTooOld, choose_device, probe_cuda
from rlfleet.common.clients.version_probe import VersionProbe
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.config import Experiment, dump
from rlfleet.common.envs import probe_env
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.runtime import FatalError, StartupError
from rlfleet.common.security import client_curve, refused_hint
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.services.learner import ranks
from rlfleet.services.learner.imagination import ImaginedMix
from rlfleet.services.learner.publishing import BackgroundPublisher, Outcome
from rlfleet.services.learner.training import Trainer

log = logging.getLogger("rlfleet.learner")

CHECKPOINT = "checkpoint.pt"
ASYNC_PUBLISH_S = 1.0  # an async publish waits this long for its acks, plus the time to send at:
SLOW_LINK_BYTES_PER_S = 10e6
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
        self.device_choice = self._choose_device(obs_space, act_space)
        # several learners: ranks of one group, each training on its share of every batch (ranks.py)
        self.group = ranks.join_answering_health(cfg, self.device_choice.device) if cfg.learners > 1 \
            else None
        self.rank = self.group.rank if self.group is not None else 0
        self.averager = GradientAverager() if self.group is not None else None
        self.core = self.algo.make_learner(
            ranks.per_rank_config(cfg.algorithm, cfg.learners), obs_space, act_space,
            device=self.group.device if self.group is not None else self.device_choice.device,  # a rank: its own GPU
            seed=cfg.seed, averager=self.averager,
        )
        self.metrics = ServiceMetrics("learner", self.rank)
        self._define_metrics()
        self.m_device.labels(str(self.core.device), self.device_choice.reason).set(1)
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
        # one paramserver client: publishes, barriers and version probes share its connections
        self.publisher = WeightsPublisher(cfg.network.paramserver, "learner", curve=client_curve(cfg, "learner"))
        self.probe = VersionProbe(self.publisher.shards, every_s=REPUBLISH_CHECK_S,
                                  timeout_s=min(5.0, cfg.network.timeout_s))
        if self.averager is not None:  # one rank of several: the state of the rank that trained furthest
            broadcast_learner(self.core, self.averager)
            self.m_world.set(self.averager.world)
        if self.rank == 0:
            self.start_from_fleet(resumed=state is not None)
        if self.averager is not None:  # rank 0 may have taken the fleet's weights: every rank starts from them
            broadcast_learner(self.core, self.averager, src=0)
        mix = ImaginedMix(cfg, self.core.data.batch_items, obs_space, act_space, self.metrics) \
            if cfg.planning.enabled else None
        self.background: BackgroundPublisher | None = None  # rank 0, async: publishes off this thread
        self._publish_due: str | None = None  # async: a version to publish once the one in flight is done
        self.submitted = 0  # async: the newest version handed to self.background (acked or not)
        # the newest version handed out: once the publish thread sent it, actors may act on it before its
        # ack is applied here, and their items must not count as from a version the learner never had
        self.trainer = Trainer(cfg, self.core, self.metrics, lambda: max(self.version, self.submitted),
                               lambda: self._stopping, mix)
        self.m_reconnects = self.trainer.m_reconnects
        self.published: dict[str, Any] = {}  # arrays of self.version, checkpointed for `rlfleet eval`
        self.last_ckpt = time.monotonic()
        self.ckpt_writer = CheckpointWriter()  # the training thread takes the snapshot; this thread writes it
        self._ps_failing = False
        # Ask the paramserver before /metrics is up: a learner killed after publishing a version newer
        # than its checkpoint must not show the checkpoint's (older) version while it starts.
        self.start_version = self.first_version()
        self.m_version.set(max(self.version, self.start_version - 1))
        log.info("learner: %s on %s, %s protocol", cfg.algorithm.name, self.core.device, cfg.sync)

    def _choose_device(self, obs_space: Any, act_space: Any) -> DeviceChoice:
        """``learner.device`` decided (common/algorithms/device_choice.py: auto's rule) and said in the log."""
        cfg = self.cfg

        def parameters() -> int:  # auto with CUDA usable: how big the networks are, built on CPU
            cpu = self.algo.make_learner(ranks.per_rank_config(cfg.algorithm, cfg.learners), obs_space, act_space,
                                         device="cpu", seed=cfg.seed)
            return sum(int(w.size) for w in cpu.weights().values())

        try:
            choice = choose_device(cfg.learner.device, probe_cuda, parameters)
        except (DriverTooOld, ValueError) as exc:
            raise StartupError(f"{exc} (learner.device={cfg.learner.device})") from None
        log.info("learner: trains on %s (%s): %s", choice.device, choice.reason, choice.detail)
        return choice

    def _define_metrics(self) -> None:
        m = self.metrics
        self.m_device = m.gauge("learner_device_info", "1 for the device this learner trains on, and why "
                                "(asked; auto: CUDA, no CUDA or small network).", ["device", "reason"])
        self.m_version = m.gauge("learner_version", "Newest weights version published.")
        self.m_world = m.gauge("learner_world_size", "Learners in this learner's data-parallel group.")
        self.m_world.set(1)
        self.m_allreduce = m.counter("learner_allreduce_seconds",
                                     "Seconds this learner spent averaging gradients with the other learners.")
        self.m_publishes = m.counter("learner_publishes", "Weights versions published.")
        self.m_barrier = m.counter("learner_barrier_wait_seconds", "Seconds the learner waited at barriers.")
        self.m_ckpt = m.counter("learner_checkpoints", "Checkpoints written.")
        self.m_republish = m.counter("learner_republishes",
                                     "Current weights sent again to a paramserver shard that had lost them.")

    # -- publish / checkpoint ---------------------------------------------------
    def publish(self, version: int, retry: bool = True) -> bool:
        """Publish ``version``; True once every shard acked it.

        With ``retry`` it tries until the paramserver acks (barrier: nobody can
        act before the next version anyway). Without, one try: async training
        goes on while the paramserver is away (the actors act on the weights
        they hold), and :meth:`ensure_published` publishes once it is back.
        """
        if self.rank != 0:  # rank 0 publishes; the others follow its version (staleness is judged by it)
            self.version = version
            self.m_version.set(version)
            return True
        weights = self.core.weights()
        while True:
            try:
                self.publisher.publish(version, weights, timeout_s=self._publish_timeout(weights, retry))
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

    def _publish_timeout(self, weights: Mapping[str, Any], retry: bool) -> float:
        """How long a publish may wait for its acks. Retried publishes (start, barrier) wait
        ``network.timeout_s``; an async one that training goes on without waits about what sending
        the weights takes at 10 MB/s, plus a second: a dead paramserver must not stop the learner
        for ``network.timeout_s`` (the actors' inserts would pile up against the rate limiter)."""
        if retry:
            return self.cfg.network.timeout_s
        nbytes = sum(w.nbytes for w in weights.values())
        return min(self.cfg.network.timeout_s, ASYNC_PUBLISH_S + nbytes / SLOW_LINK_BYTES_PER_S)

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
        if self.rank != 0:
            return
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
            self._publish_due = "republish"
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
        """Continue after whatever the paramserver holds (a restarted learner never goes back)."""
        held = self.newest_held()
        return max(self.version, held + 1) if held >= 0 else self.version

    def newest_held(self) -> int:
        """The newest version any paramserver shard holds (-1: none).

        Asked with ``info`` (the versions each shard holds), not by fetching the
        weights; the newest version any shard holds counts, since a shard
        refuses a version that is not newer than its own (``stale_version``).
        """
        try:
            return max(self.probe.newest(self.cfg.network.timeout_s))
        except (CommTimeout, RemoteError) as exc:
            raise StartupError(
                f"paramserver at {self.cfg.network.paramserver} did not answer within "
                f"{self.cfg.network.timeout_s:g} s (network.paramserver): {exc}{refused_hint(self.cfg, 'learner')}"
            ) from None

    def start_from_fleet(self, resumed: bool) -> None:
        """Take the paramserver's newest weights when the fleet has trained further than this learner.

        A learner that starts with no checkpoint (killed before its first one, or moved to a node
        whose volume never held it) or with one older than the paramserver's newest version must not
        publish its own weights as a newer version: that would throw the fleet's training away. It
        loads the published arrays into its networks (``load_weights``: what acting needs; critics,
        targets and optimizer moments of a checkpoint stay, a fresh learner's stay as initialised)
        and continues the fleet's version numbers. The update counter is the checkpoint's, or 0; with no
        checkpoint what runs on env steps goes on from the fleet's (the registry's count, shard 0).
        """
        held = self.newest_held()
        if held < 0 or (resumed and held <= self.version):
            return
        reader = WeightsReader(self.cfg.network.paramserver, "learner", curve=client_curve(self.cfg, "learner"),
                               timeout_s=self.cfg.network.timeout_s)
        try:
            got = reader.get(-1)
        except (CommTimeout, RemoteError) as exc:
            raise StartupError(f"paramserver at {self.cfg.network.paramserver} holds version {held}, and did not "
                               f"give its weights: {exc}{refused_hint(self.cfg, 'learner')}") from None
        finally:
            reader.close()
        if got is None:
            raise StartupError(f"paramserver at {self.cfg.network.paramserver} holds version {held} on some shard, "
                               "and no version on every shard: start every paramserver shard, or restart them all "
                               "empty to train from scratch")
        version, weights = got
        try:
            self.core.load_weights(weights)
        except ValueError as exc:
            raise StartupError(f"paramserver at {self.cfg.network.paramserver} holds version {version} of another "
                               f"network ({exc}): a paramserver of another experiment? Point network.paramserver "
                               "at this experiment's, or restart it empty to train from scratch") from None
        env_steps = None if resumed else self.fleet_env_steps()
        if env_steps is not None:
            self.core.resume_env_steps(env_steps)
        log.warning("learner: %s; starting from the fleet's weights version %d (paramserver's newest %d), "
                    "update counter %d%s", f"checkpoint at version {self.version} is older" if resumed
                    else "no checkpoint", version, held, self.core.num_updates,
                    "" if env_steps is None else f", the fleet's env steps {env_steps}")
        self.version = held

    def fleet_env_steps(self) -> int | None:
        """The env steps the paramserver's registry (shard 0) counted, restarts included; None if it does not say."""
        try:
            reply = self.publisher.shards.gather({0: Message("info", {})},
                                                 time.monotonic() + self.cfg.network.timeout_s)[0]
        except CommTimeout:
            return None
        stats = reply.get("stats") if reply.type == "info_reply" else None
        steps = stats.get("fleet_env_steps") if isinstance(stats, dict) else None
        return steps if type(steps) is int and steps >= 0 else None

    def checkpoint(self, wait: bool = False) -> None:
        """A snapshot of the learner (CPU copies, taken here), written to disk by :attr:`ckpt_writer`'s thread
        while training goes on; ``wait``: until it is on disk."""
        if self.rank != 0:  # every rank holds the same state: rank 0 writes it
            return
        state: dict[str, Any] = {"core": self.core.state(), "version": self.version, "config": dump(self.cfg)}
        if self.published:  # the exact arrays actors and the evaluator got as `version` (never changed in place)
            state["weights"] = {k: torch.from_numpy(v) for k, v in self.published.items()}
        self.ckpt_writer.write(self.ckpt, state, self.m_ckpt.inc)
        self.last_ckpt = time.monotonic()
        if wait:
            self.ckpt_writer.wait()

    def _maybe_checkpoint(self) -> None:
        if time.monotonic() - self.last_ckpt >= self.cfg.learner.checkpoint_every_s:
            self.checkpoint()

    def run(self) -> None:
        try:
            self._run()
        except CollectiveError as exc:
            assert self.group is not None
            raise FatalError(f"learner rank {self.rank} of {self.group.world}: the group at {self.group.address} "
                             f"lost a rank ({exc}); restart every learner: they resume from rank 0's checkpoint"
                             ) from None

    def _run(self) -> None:
        self.publish(self.start_version)
        if self.rank == 0:
            log.info("learner: published version %d", self.version)
        else:
            log.info("learner: rank %d trains on its share; rank 0 publishes and checkpoints", self.rank)
        if self.cfg.sync == "async":
            self._run_async()
        else:
            self._run_barrier()

    def _run_async(self) -> None:
        every = self.cfg.learner.publish_every
        published_at = self.core.num_updates
        if self.rank == 0:
            self.submitted = self.version
            self.background = BackgroundPublisher(
                WeightsPublisher(self.cfg.network.paramserver, "learner", curve=client_curve(self.cfg, "learner")),
                lambda weights: self._publish_timeout(weights, retry=False))
        while not self._stopping:
            # one learn call may take many optimizer steps (PPO: epochs x minibatches): publish when it
            # crossed a multiple of publish_every
            if (self.trainer.update_once(timeout_s=0.5) and self.core.num_updates // every > published_at // every
                    and not self._ps_failing):
                published_at = self.core.num_updates
                self._publish_due = self._publish_due or "update"
            self._publish_in_background()
            self._maybe_checkpoint()
            self.ensure_published()
            if self.averager is not None and self.averager.seconds:
                self.m_allreduce.inc(self.averager.seconds)
                self.averager.seconds = 0.0

    def _publish_in_background(self) -> None:
        """Async: apply what the publish thread finished, then hand it a due version if it is free.

        The snapshot is taken only once the previous publish is done, so a slow paramserver costs
        the training thread nothing and gets the newest weights. Ranks other than 0 only follow the
        version numbers (nothing to send)."""
        if self.background is None:
            if self._publish_due is not None:
                self._publish_due = None
                self.publish(self.version + 1, retry=False)
            return
        for outcome in self.background.drain():
            self._apply(outcome)
        if self._publish_due is not None and not self.background.busy:
            self.submitted = max(self.submitted, self.version) + 1
            self.background.submit(self.submitted, self.core.weights(), self._publish_due)
            self._publish_due = None

    def _apply(self, outcome: Outcome) -> None:
        """One finished background publish, on the training thread: the version acked by every shard
        becomes the learner's (what it reports and checkpoints); a refusal is handled as
        :meth:`publish` handles it."""
        error = outcome.error
        if error is None:
            self._paramserver_answered()
            self.m_publishes.inc()
            if outcome.tag == "republish":
                self.m_republish.inc()
            if outcome.version > self.version:
                self.version = outcome.version
                self.m_version.set(outcome.version)
                self.published = dict(outcome.weights)
            return
        if isinstance(error, CommTimeout):
            self._ps_failing = True
            log.warning("learner: paramserver did not ack version %d; training on", outcome.version)
            return
        if isinstance(error, RemoteError) and error.reason == "stale_version":
            # the paramserver holds a newer version than ours: continue after it, with the current weights
            self.submitted = max(self.submitted, self.first_version() - 1)
            log.warning("learner: paramserver holds newer weights; publishing as version %d", self.submitted + 1)
            self._publish_due = outcome.tag or "update"
            return
        raise FatalError(f"paramserver refused version {outcome.version}: {error}") from None

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
            rnd = self.algo.make_round(self.core, self.cfg.learner.updates_per_round, actors * self.cfg.env.num_envs,
                                       self.cfg.actor.steps_per_round)
            done = self.trainer.run_round(rnd)
            if self._stopping:
                break
            self.publish(self.version + 1)
            log.debug("learner: round %d: %d actors, %d updates", self.version - 1, actors, done)
            self._maybe_checkpoint()

    # -- service contract ---------------------------------------------------------
    def stop(self) -> None:
        self._stopping = True

    def health(self) -> dict[str, Any]:
        return {"ok": not self._stopping, "updates": self.core.num_updates, "version": self.version,
                "device": str(self.core.device), "rank": self.rank,
                "learners": self.group.world if self.group is not None else 1}

    def close(self) -> None:
        try:
            if self.background is not None:  # the publish in flight finishes, so its ack is checkpointed
                self.background.close(timeout_s=self.cfg.network.timeout_s)
                for outcome in self.background.drain():
                    if outcome.error is None:
                        self._apply(outcome)
            if self.rank == 0:
                self.checkpoint(wait=True)
                log.info("learner: checkpoint at update %d, version %d -> %s", self.core.num_updates, self.version,
                         self.ckpt)
        finally:
            self.ckpt_writer.close()
            self.trainer.close()
            self.publisher.close()
            if self.group is not None:
                ranks.leave()
