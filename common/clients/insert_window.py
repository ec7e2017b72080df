"""What an :class:`~rlfleet.common.clients.replay_insert.InsertClient` holds for replay: the un-acked messages of
its window (kept for resending) and the inserts waiting to go merged into one message (coalescing).

Coalescing (``coalesce``, ``actor.coalesce_inserts``): an insert made while
earlier ones are un-acked is not sent at once: it starts (or joins) one
pending message of up to ``coalesce`` inserts of the same table and columns,
which goes as one insert (one seq, its items concatenated) once an ack leaves
nothing in flight or ``coalesce`` inserts are waiting, whichever comes first
(as Nagle's algorithm and Kafka's producer batch while earlier requests are in
flight). An idle replay sees every insert at once, as without coalescing; a
busy one gets fewer, larger messages. The window counts inserts, the pending
ones included, so how far an actor runs ahead of a rate limiter that holds
its acks is unchanged: ``max_unacked`` inserts. Off when ``max_unacked < 2 x
coalesce`` (a window that small has no room to merge in), for image columns
sent frame by frame and, from a config, for queue tables (their batches of
segments are what the learner takes whole); a merged insert holds at most a
quarter of its table's capacity (one larger than the table is refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Unacked:
    frames: list[Any]
    nbytes: int
    items: int
    inserts: int  # the caller's inserts this message carries (coalesced)
    interval: float  # wait before the next resend; doubles on each resend
    sent_at: float = 0.0

    @property
    def due(self) -> float:
        return self.sent_at + self.interval


class PendingInsert:
    """Inserts made while others were in flight, merged into one message: their columns are copied
    (the caller may reuse its buffers) into buffers of ``rows`` items (coalesce inserts of the first's size,
    or the table's limit)."""

    def __init__(self, table: str, seq: int, arrays: Mapping[str, np.ndarray], items: int, nbytes: int,
                 rows: int, max_bytes: int) -> None:
        self.table = table
        self.seq = seq
        self.inserts = 1
        self.items = items
        self.nbytes = nbytes
        self.max_bytes = max_bytes
        self.rows = rows  # room in every buffer
        self.names = list(arrays)  # in order: the columns are copied by position
        self.layout = [(a.dtype, a.shape[1:]) for a in arrays.values()]
        self.buffers = [np.empty((self.rows, *a.shape[1:]), a.dtype) for a in arrays.values()]
        for buf, a in zip(self.buffers, arrays.values(), strict=True):
            buf[:items] = a

    def add(self, table: str, arrays: Mapping[str, np.ndarray], items: int, nbytes: int) -> bool:
        """Copy one more insert in; False (nothing done) if it has another table or layout or no room."""
        start = self.items
        if (table != self.table or start + items > self.rows or self.nbytes + nbytes > self.max_bytes
                or list(arrays) != self.names
                or [(a.dtype, a.shape[1:]) for a in arrays.values()] != self.layout):
            return False
        end = start + items
        for buf, a in zip(self.buffers, arrays.values(), strict=True):
            buf[start:end] = a
        self.inserts += 1
        self.items = end
        self.nbytes += nbytes
        return True

    def columns(self) -> dict[str, np.ndarray]:
        return {k: buf[:self.items] for k, buf in zip(self.names, self.buffers, strict=True)}


def merge_rows(coalesce: int, items: int, limit: int | None) -> int:
    """Items a pending message that starts with an insert of ``items`` may hold (``coalesce`` such
    inserts, at most ``limit`` items: None for no limit); 0 when it could not hold two, so is not merged."""
    rows = coalesce * items if limit is None else min(coalesce * items, limit)
    return rows if rows >= 2 * items > 0 else 0
