"""The Prometheus series of a replay shard, registered in one place.

The parts of the server (:mod:`rlfleet.services.replay.held_requests`,
:mod:`rlfleet.services.replay.burst_replies`, ...) each count in some of them; they
are registered here once because a series may be registered only once per
service, and so that every name a dashboard reads is in one file.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlfleet.common.metrics import ServiceMetrics


class ReplayMetrics:
    """The replay series, and the labelled children the hot paths count in (a ``labels()`` lookup
    per insert costs more than the increment)."""

    def __init__(self, m: ServiceMetrics, tables: Iterable[str]) -> None:
        names = list(tables)
        self.size = m.gauge("replay_size", "Items in each table.", ("table",))
        self.inserts = m.counter("replay_inserts", "Items stored, by table.", ("table",))
        self.samples = m.counter("replay_samples", "Items sampled, by table.", ("table",))
        self.duplicates = m.counter("replay_duplicates", "Duplicate insert messages dropped, by table.", ("table",))
        self.ignored = m.counter("replay_priority_updates_ignored", "Priority updates for evicted keys.", ("table",))
        self.wait = m.counter("rate_limiter_wait_seconds", "Seconds requests were held by the rate limiter.",
                              ("side",))
        self.held = m.gauge("rate_limiter_held", "Requests held by the rate limiter now.", ("side",))
        self.dropped = m.counter("replay_inserts_dropped",
                                 "Inserts dropped unacked: too many held, or too many bytes held.")
        self.snapshot_seconds = m.gauge("replay_snapshot_seconds", "Seconds the last snapshot took to write.")
        self.wal_failed = m.counter("replay_wal_failures", "Records the write-ahead log could not take (disk "
                                    "full): inserts refused and queue pops not served, by op.", ("op",))
        # exported at 0 from the start, so that a rate() over them is defined before the first event
        self.wal_failed_insert, self.wal_failed_pop = self.wal_failed.labels("insert"), self.wal_failed.labels("pop")
        for name in names:
            self.size.labels(name).set(0)
        self.table_inserts: dict[str, Any] = {name: self.inserts.labels(name) for name in names}
        self.table_size: dict[str, Any] = {name: self.size.labels(name) for name in names}
        self.held_inserts, self.held_samples = self.held.labels("insert"), self.held.labels("sample")
        self.wait_insert, self.wait_sample = self.wait.labels("insert"), self.wait.labels("sample")
        self.wait_insert.inc(0)
        self.wait_sample.inc(0)
