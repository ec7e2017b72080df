"""Writing a checked insert: into the log (``wal``), into its table, into dedup, and its ack queued."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlfleet.common.wire.dedup import Dedup
from rlfleet.common.wire.errors import RequestError
from rlfleet.common.wire.server import Peer
from rlfleet.services.replay.burst_replies import BurstReplies
from rlfleet.services.replay.columnar import Table
from rlfleet.services.replay.storage import WalError, WriteAheadLog


class InsertWriter:
    """Stores inserts that were checked and that the rate limiter admits. Holds no state of its own:
    it writes to the log, the table, the dedup and the burst's replies it is handed."""

    def __init__(self, wal: WriteAheadLog | None, dedup: Dedup, replies: BurstReplies, wal_failures: Any) -> None:
        self.wal = wal
        self.dedup = dedup
        self.replies = replies
        self._wal_failures = wal_failures  # replay_wal_failures{op="insert"}

    def commit(self, table: Table, peer: Peer, arrays: dict[str, np.ndarray], priority: np.ndarray | None,
               window_start: int | None, n: int, merge_acks: bool) -> None:
        """Log the insert (wal), store it, remember its (sender, seq) and queue its ack.

        Logged first: an insert the log refuses (disk full) is not stored either, so its resend
        is stored once; the sender is answered ``wal_failed`` (RequestError)."""
        if self.wal is not None:
            logged = arrays if priority is None else {**arrays, "__priority__": priority}
            try:
                self.wal.append_insert(table.name, table.next_key, logged, peer.sender, peer.seq, window_start)
            except WalError as exc:  # counted in replay_wal_failures, not as a protocol error
                self._wal_failures.inc()
                raise RequestError("wal_failed", f"insert not stored: {exc}; nothing of it was stored, "
                                                 "send it again later", count=False) from None
        table.insert(arrays, priority, n)
        self.stored(table, peer.identity, peer.seq, peer.sender, window_start, n, merge_acks)

    def stored(self, table: Table, identity: bytes, seq: int, sender: str, window_start: int | None, n: int,
               merge_acks: bool) -> None:
        """After an insert is stored (and logged): remember its (sender, seq), count it, queue its ack."""
        self.dedup.add(sender, seq, window_start)
        self.replies.ack_stored(table.name, identity, seq, sender, n, merge_acks)
