"""The Prometheus metrics of one paramserver shard, declared in one place and handed to the parts
that update them.

Every shard exports all of them, the shard-0-only ones (live actors, barrier waits) included, so
that a dashboard sees the same series on every shard.
"""

from __future__ import annotations

from typing import Any

from rlfleet.common.metrics import ServiceMetrics


class ShardMetrics:
    """The shard's counters, gauges and histograms (all names prefixed ``rlfleet_paramserver_``)."""

    def __init__(self, m: ServiceMetrics) -> None:
        self.version: Any = m.gauge("paramserver_version", "Newest weights version held by this shard (-1: none).")
        self.version.set(-1)
        self.publishes: Any = m.counter("paramserver_publishes", "Versions stored by this shard.")
        self.gets: Any = m.counter("paramserver_gets", "get requests served.")
        self.waits: Any = m.counter("paramserver_waits", "wait (long poll) requests received.")
        self.weights_served: Any = m.counter("paramserver_weights_served", "weights replies sent (get and wait).")
        self.not_modified: Any = m.counter("paramserver_not_modified", "not_modified replies sent (get and wait).")
        self.waits_parked: Any = m.gauge("paramserver_waits_parked", "Long polls waiting for a newer version.")
        self.live_actors: Any = m.gauge("paramserver_live_actors", "Live registered actors (shard 0).")
        self.barrier_wait: Any = m.histogram(
            "paramserver_barrier_wait_seconds", "Time a barrier request waited for the actors (shard 0).",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.pushes: Any = m.counter("paramserver_gradients_applied", "Gradient pushes applied to this shard's slice.")
        self.refused: Any = m.counter(
            "paramserver_gradients_refused", "Gradient pushes refused (nothing applied), by"
            " reason: stale_gradients, bad_gradients, layout_mismatch, ...", ("reason",))
        self.staleness: Any = m.histogram(
            "paramserver_gradients_staleness", "Versions between the one a push was computed on and the newest"
            " when it was applied.", buckets=(0, 1, 2, 4, 8, 16, 32, 64))
        for reason in ("stale_gradients", "bad_gradients"):
            self.refused.labels(reason)  # exported at 0 from the start
