"""What the learner does between two publishes: sample, drop stale items, learn, count.

:class:`Trainer` holds the algorithm's learner core and the replay client. It
asks the core how to consume data (``core.data``: items per request, staleness
bound, how a barrier round is consumed) and never the algorithm's name:

- async: one learn call per sampled batch (:meth:`Trainer.update_once`);
- barrier: the round the core's data spec gives (:meth:`Trainer.run_round`): N learn calls on fresh
  batches, or every item the round's actors inserted once, in one learn call.

Items acted with weights more than ``max_staleness`` versions old are dropped
and counted (``rlfleet_learner_items_dropped_total{reason="stale"}``); the
staleness of the items learnt from is a histogram
(``rlfleet_learner_item_staleness``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from rlfleet.common import algorithms
from rlfleet.common.algorithms.contract import Learner
from rlfleet.common.algorithms.rounds import Round, concat_in_canonical_order
from rlfleet.common.clients.replay_sample import SampleBatch, SampleClient
from rlfleet.common.config import Experiment
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.tboard import scalar_writer
from rlfleet.common.wire.errors import CommTimeout
from rlfleet.services.learner.imagination import ImaginedMix

log = logging.getLogger("rlfleet.learner")

STALENESS_SAMPLES = 8  # items of a batch observed in rlfleet_learner_item_staleness (evenly spaced: ~1.5 us each)


class Trainer:
    def __init__(self, cfg: Experiment, core: Learner, metrics: ServiceMetrics, version: Callable[[], int],
                 stopping: Callable[[], bool], mix: ImaginedMix | None = None) -> None:
        """``mix``: parallel Dyna-Q's imagined batches (services/learner/imagination.py), or None."""
        self.cfg = cfg
        self.core = core
        self.version = version  # the weights version the learner holds now
        self.stopping = stopping
        self.sampler = SampleClient.from_config(cfg, "learner", batch_size=core.data.batch_items)
        self.mix = mix
        self.table = next(t for t in cfg.replay.tables if t.name == cfg.learner.table)
        self.tb = scalar_writer(cfg, "learner")  # RUN_DIR/tensorboard/learner; a no-op without tensorboard
        self._tb_last = 0.0
        self._replay_reconnects = 0
        m = metrics
        self.m_updates = m.counter("learner_updates", "Gradient updates done (continues across restarts).")
        self.m_updates.inc(core.num_updates)
        self.m_loss = m.gauge("learner_loss", "Loss of the last update.")
        self.m_stats = m.gauge("learner_stat", "The algorithm's figures of its last update (q_mean, entropy, ...).",
                               ("stat",))
        self.m_staleness = m.histogram(
            "learner_item_staleness", "Versions between the weights an item was acted with and the learner's.",
            buckets=(0, 1, 2, 4, 8, 16, 32, 64))
        self.m_dropped = m.counter("learner_items_dropped", "Items not trained on, by reason (stale: acted with"
                                   " weights more than the algorithm's max_staleness versions old; invalid_version:"
                                   " a version below 0 or above the learner's, which no actor acted with;"
                                   " malformed: a batch the algorithm could not learn from, e.g. columns it does"
                                   " not have).", ("reason",))
        for reason in ("stale", "invalid_version", "malformed"):
            self.m_dropped.labels(reason).inc(0)
        self._bad_batches: set[str] = set()  # the kinds of bad batch already logged (each once)
        self.m_wait = m.counter("learner_sample_wait_seconds", "Seconds the learner waited for a batch.")
        self.m_ups = m.gauge("learner_updates_per_second", "Updates per second over the last 10 s.")
        self.m_reconnects = m.counter("reconnects", "Connections re-established to a peer that had gone.", ("peer",))
        for peer in ("replay", "paramserver"):
            self.m_reconnects.labels(peer).inc(0)
        self._rate = (time.monotonic(), core.num_updates)

    def take_batch(self, timeout_s: float) -> SampleBatch | None:
        """One sampled batch (None if none came within timeout_s); waits and reconnects counted."""
        start = time.monotonic()
        try:
            batch = self.sampler.sample(timeout_s=timeout_s)
        except CommTimeout:
            batch = None
        self.m_wait.inc(time.monotonic() - start)
        if self.sampler.reconnects > self._replay_reconnects:
            self.m_reconnects.labels("replay").inc(self.sampler.reconnects - self._replay_reconnects)
            self._replay_reconnects = self.sampler.reconnects
        return batch

    def learn(self, data: dict[str, np.ndarray], weights: np.ndarray | None = None,
              batch: SampleBatch | None = None, sampler: SampleClient | None = None) -> bool:
        """Drop stale items, learn on the rest, send priorities back to ``batch``'s shard (through ``sampler``,
        the client it came from; default: the real table's); False if all were stale."""
        try:
            version = self.version()
            kept, weights, stale, invalid = algorithms.drop_stale(data, version, self.core.data.max_staleness,
                                                                  weights)
            behind = None
            if "version" in data:  # of the items with a valid version only: a forged one is no staleness
                versions = np.asarray(data["version"], np.int64).reshape(-1)
                behind = version - versions[(versions >= 0) & (versions <= version)]
            if behind is not None and len(behind):
                step = max(1, len(behind) // STALENESS_SAMPLES)  # a big batch: evenly spaced items, not all
                for b in behind[::step]:
                    self.m_staleness.observe(b)
            dropped = stale + invalid
            if dropped:
                self.m_dropped.labels("stale").inc(stale)
                self.m_dropped.labels("invalid_version").inc(invalid)
                if len(kept["version"]) == 0:
                    return False
            before = self.core.num_updates
            figures, priorities = self.core.learn(kept, weights)
        except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as exc:
            # replay accepted what this algorithm cannot learn from (a table whose schema another client
            # fixed, a column of the wrong shape): skip it and go on, counted; each kind logged once
            self._skip_malformed(data, exc)
            return True
        if priorities is not None and batch is not None and not dropped:  # (keys and priorities must match)
            (sampler or self.sampler).update_priorities(batch, priorities)
        self.m_updates.inc(self.core.num_updates - before)
        self.m_loss.set(figures.get("loss", float("nan")))
        for name, value in figures.items():
            self.m_stats.labels(name).set(value)
        if time.monotonic() - self._tb_last >= 1.0:  # TensorBoard: once a second is plenty
            self._tb_last = time.monotonic()
            self.tb.add_many({**{f"learner/{k}": v for k, v in figures.items()}, "learner/version": self.version()},
                             step=self.core.num_updates)
        now = time.monotonic()
        if now - self._rate[0] >= 10.0:
            self.m_ups.set((self.core.num_updates - self._rate[1]) / (now - self._rate[0]))
            self._rate = (now, self.core.num_updates)
        return True

    def _skip_malformed(self, data: dict[str, np.ndarray], exc: Exception) -> None:
        rows = len(next(iter(data.values()))) if data else 0
        self.m_dropped.labels("malformed").inc(rows)
        kind = f"{type(exc).__name__}: {exc}"
        if kind not in self._bad_batches:
            self._bad_batches.add(kind)
            log.warning("learner: skipped a batch it cannot learn from (%s); columns %s; counted in"
                        " rlfleet_learner_items_dropped_total{reason=\"malformed\"}", kind,
                        {k: f"{np.asarray(v).dtype}{list(np.shape(v))}" for k, v in data.items()})

    def update_once(self, timeout_s: float) -> bool:
        """One learn call on one sampled batch; False if no batch came within timeout_s (or all was stale)."""
        if self.mix is not None and self.mix.due():
            imagined = self.mix.take()
            if imagined is not None:
                self.mix.count("imagined", len(imagined.keys))
                return self.learn(imagined.data, self.core.weigh(imagined.probability), imagined, self.mix.sampler)
        batch = self.take_batch(timeout_s)
        if batch is not None and self.mix is not None:
            self.mix.count("real", len(batch.keys))
        return batch is not None and self.learn(batch.data, self.core.weigh(batch.probability), batch)

    def replay_ready(self) -> bool:
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

    def run_round(self, rnd: Round) -> int:
        """One barrier round as ``rnd`` says (common/algorithms/rounds.py); returns the learn calls done.

        Only this round's batches are asked for, after its inserts. A round has a deadline: replay
        restarting mid-round must not hold every actor forever."""
        if rnd.kind == "updates":
            return self._updates(rnd)
        return self._every_item(rnd)

    def _updates(self, rnd: Round) -> int:
        """``rnd.learn_calls`` learn calls, each on a fresh batch (none while replay is below its min size)."""
        want = rnd.learn_calls
        done = 0
        if not self.replay_ready():
            return done
        self.sampler.ask_for(rnd.requests())
        deadline = time.monotonic() + self.cfg.network.timeout_s
        while done < want and not self.stopping() and time.monotonic() < deadline:
            if self.update_once(timeout_s=1.0):
                done += 1
                deadline = time.monotonic() + self.cfg.network.timeout_s
        if done == 0:
            self.sampler.forget_sizes()  # e.g. replay restarted empty: ask it again next round
        if done < want and not self.stopping():
            log.warning("learner: round %d ended after %d of %d updates: no batch for %.0f s",
                        self.version(), done, want, self.cfg.network.timeout_s)
        return done

    def _every_item(self, rnd: Round) -> int:
        """Every item of the round once, in one learn call."""
        want, per_batch = rnd.items, rnd.batch_items
        self.sampler.ask_for(rnd.requests())
        parts: list[dict[str, np.ndarray]] = []
        got = 0
        deadline = time.monotonic() + self.cfg.network.timeout_s
        while got < want and not self.stopping() and time.monotonic() < deadline:
            batch = self.take_batch(timeout_s=1.0)
            if batch is None:
                if self.sampler.wanted == 0:  # a queue answered short: ask for the rest
                    self.sampler.ask_for(-(-(want - got) // per_batch))
                continue
            parts.append(batch.data)
            got += len(batch.keys)
            deadline = time.monotonic() + self.cfg.network.timeout_s
        if got < want and not self.stopping():
            log.warning("learner: round %d got %d of its %d items within %.0f s", self.version(), got, want,
                        self.cfg.network.timeout_s)
        # in an order that arrival does not decide (same seeds, same weights)
        return 1 if parts and self.learn(concat_in_canonical_order(parts)) else 0

    def close(self) -> None:
        self.sampler.close()
        if self.mix is not None:
            self.mix.close()
        self.tb.close()
