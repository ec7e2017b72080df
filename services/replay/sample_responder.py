"""Answering a sample the rate limiter let go: a batch of the table's items, or the log's refusal."""

from __future__ import annotations

import time

from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.server import Peer
from rlfleet.services.replay.burst_replies import BurstReplies
from rlfleet.services.replay.columnar import Table
from rlfleet.services.replay.metrics import ReplayMetrics
from rlfleet.services.replay.replier import Replier
from rlfleet.services.replay.storage import WalError, WriteAheadLog
from rlfleet.services.replay.tables import QueueTable


class SampleResponder:
    """Samples a table and sends the batch. A queue table's pop is logged first (``wal``), and its
    batch is sent with the burst's acks, after the fsync of that pop. Holds no state of its own."""

    def __init__(self, loop: Replier, wal: WriteAheadLog | None, replies: BurstReplies, shard: int,
                 metrics: ReplayMetrics) -> None:
        self.loop = loop
        self.wal = wal
        self.replies = replies
        self.shard = shard
        self.metrics = metrics

    def answer(self, table: Table, peer: Peer, batch_size: int, counted: bool, since: float) -> None:
        """Send ``peer`` a batch of ``batch_size`` items (``counted``: by the rate limiter), asked at ``since``."""
        size = table.size
        popped = self.wal is not None and isinstance(table, QueueTable)
        if popped:
            # the pop goes on disk before the items leave the queue; the log refusing it (disk full)
            # leaves them queued and the learner is told to ask again
            assert self.wal is not None
            try:
                self.wal.append_pop(table.name, table.oldest_key + min(batch_size, size))
            except WalError as exc:
                self.metrics.wal_failed_pop.inc()
                self.loop.reply_error(peer, "wal_failed", f"sample not served: {exc}; the items stay queued, ask "
                                                          "again later", count=False)
                return
        s = table.sample(batch_size, counted=counted)
        self.metrics.samples.labels(table.name).inc(len(s.keys))
        self.metrics.wait_sample.inc(time.monotonic() - since)
        arrays = {"key": s.keys, "probability": s.probability, **s.data}
        body = {"table": table.name, "shard": self.shard, "table_size": size}
        batch = Message("batch", body, arrays)
        if popped:  # sent with the burst's acks, after the fsync of its pop
            self.replies.defer(peer, batch)
        else:
            self.loop.reply(peer, batch)
