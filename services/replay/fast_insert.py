"""Inserts stored from their frames, without a full decode.

A connection that sent inserts alike but for seq and window_start (as
InsertClient sends them) has their header up to window_start remembered, for
each of its last few layouts (a layout is learnt the second time it is seen;
an InsertClient that merges inserts sends a few batch sizes); its next
inserts of a known layout are checked against those bytes and copied into the
table from the payload frame. Anything else (a duplicate, a held insert, a bad priority,
another header...) takes the full decode and :meth:`ReplayServer.on_insert`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.wire.codec import DTYPES
from common.wire.decoder import PackedLayout
from common.wire.errors import RequestError
from common.wire.inserts import insert_header_prefix, read_insert_tail
from common.wire.server import Peer
from services.replay.columnar import PackedPlan, Table, TableError
from services.replay.held_requests import HeldRequestServer
from services.replay.priorities import check_priorities

log = logging.getLogger(__name__)

MAX_FAST_PEERS = 4096  # connections whose insert header prefix is remembered (all forgotten beyond)
MAX_LAYOUTS = 16  # per connection (all of its own forgotten beyond)


@dataclass
class FastInsert:
    """What the server checked of one connection's inserts: their header up to window_start
    (``prefix``), the packed layout after it and how its payload goes into the table."""

    prefix: bytes
    table: Table
    generation: int  # the table's columns it was checked against and copies into
    n: int
    nbytes: int  # of the payload frame
    sender: str  # as the server knows it (with its key's suffix under CurveZMQ)
    owner: str  # that suffix ("" without CurveZMQ)
    plan: PackedPlan
    items: tuple[tuple[str, np.dtype[Any], tuple[int, ...], int], ...]  # the decoder's, priority included
    priority: tuple[np.dtype[Any], int] | None  # its dtype and offset in the payload


class FastInsertServer(HeldRequestServer):
    """A :class:`HeldRequestServer` that takes the usual inserts of a connection from their frames.

    Its state is set up by :class:`services.replay.server.ReplayServer`; ``on_insert`` sets
    ``_stored_packed`` after storing a packed insert that asked for merged acks."""

    # by ROUTER identity, then payload bytes: the usual inserts of that connection, taken without a full decode
    fast: dict[bytes, dict[int, FastInsert]]
    fast_inserts: int  # inserts stored by _insert_fast
    _learn_failed: bool
    # by identity: the layouts of the connection's last inserts that took the full path; a layout
    # is learnt the second time it is seen (a sender whose N is new at every insert learns nothing)
    _full_layouts: dict[bytes, list[PackedLayout]]
    _stored_packed: tuple[Table, PackedLayout, int, Peer, int | None] | None

    def handle_frames(self, frames: list[Any]) -> None:
        """An insert of a connection whose last inserts were all alike but for seq and window_start
        (as InsertClient sends them) is stored from its frames by :meth:`_insert_fast`; any other
        message, and any insert that path does not take, is decoded and handled in full."""
        if len(frames) == 3:
            identity = frames[0].bytes
            layouts = self.fast.get(identity)
            fast = layouts.get(len(frames[2])) if layouts is not None else None
            if fast is not None:
                try:
                    if self._insert_fast(fast, identity, frames):
                        return
                except Exception as exc:  # answered as the full path does
                    tail = read_insert_tail(frames[1].bytes, len(fast.prefix))
                    peer = Peer(identity, tail[1] if tail is not None else -1, fast.sender)
                    if isinstance(exc, RequestError):  # e.g. wal_failed: the wal's disk is full
                        self.reply_error(peer, exc.reason, exc.detail, count=exc.count)
                        return
                    self.fast.pop(identity, None)
                    log.exception("%s: insert failed", self.name)
                    self.reply_error(peer, "internal", f"{type(exc).__name__}: {exc}")
                    return
        self._stored_packed = None
        super().handle_frames(frames)
        if self._stored_packed is not None and len(frames) == 3:
            try:
                self._learn_fast(frames)
            except Exception:  # a layout the fast path cannot take: its inserts keep the full path
                self._stored_packed = None
                if not self._learn_failed:  # once: the same layout would fail at every insert
                    self._learn_failed = True
                    log.exception("%s: insert layout not memoised (its inserts take the full path)", self.name)

    def _learn_fast(self, frames: list[Any]) -> None:
        """After a packed insert passed the full decode and was stored: remember its header's bytes
        up to window_start, if they are in InsertEncoder's form, for the next ones."""
        stored = self._stored_packed
        self._stored_packed = None
        assert stored is not None
        table, layout, n, peer, ws = stored
        if table.frames is not None:  # shared frames are looked up: no copy plan (Table.packed_plan)
            return
        identity = frames[0].bytes
        seen = self._full_layouts.get(identity)
        if seen is None or layout not in seen:  # by value: the decoder may rebuild equal layouts
            if seen is None:
                if len(self._full_layouts) >= MAX_FAST_PEERS:
                    self._full_layouts.clear()
                seen = self._full_layouts[identity] = []
            seen.append(layout)
            del seen[:-MAX_LAYOUTS]
            return
        items, nbytes = layout
        descriptors: list[Any] = []
        for name, dtype, shape, _ in items:
            if DTYPES.get(dtype.name) != dtype:
                return
            descriptors.append([name, dtype.name, list(shape)])
        header = frames[1].bytes
        owner = self.owner_suffix(frames)
        prefix = insert_header_prefix(table.name, peer.sender[:len(peer.sender) - len(owner)], descriptors)
        if not header.startswith(prefix) or read_insert_tail(header, len(prefix)) != (ws, peer.seq):
            return
        plan = table.packed_plan(items)
        if plan is None:
            return
        priority = next(((dtype, offset) for name, dtype, _, offset in items if name == "priority"), None)
        layouts = self.fast.get(identity)
        if layouts is None:
            if len(self.fast) >= MAX_FAST_PEERS:
                self.fast.clear()
            layouts = self.fast[identity] = {}
        if len(layouts) >= MAX_LAYOUTS:
            layouts.clear()
        layouts[nbytes] = FastInsert(prefix, table, table.generation, n, nbytes, peer.sender, owner, plan, items,
                                     priority)

    def _insert_fast(self, fast: FastInsert, identity: bytes, frames: list[Any]) -> bool:
        """Store an insert whose header is ``fast.prefix`` and two ints and whose payload has the
        size of that layout; False (nothing done) for anything else: a duplicate, a held insert,
        a bad priority, another header, ... all take the full path."""
        header, payload = frames[1].bytes, frames[2]
        table = fast.table
        prefix = fast.prefix
        if (len(payload) != fast.nbytes or not header.startswith(prefix) or table.generation != fast.generation
                or len(header) > self.limits.max_header_bytes
                or len(header) + fast.nbytes > self.limits.max_message_bytes
                or (self.bind_senders and self.owner_suffix(frames) != fast.owner)):
            return False
        tail = read_insert_tail(header, len(prefix))
        if tail is None or tail[0] < 0:  # a window_start out of range: the full decoder refuses it
            return False
        ws, seq = tail
        sender, n = fast.sender, fast.n
        if (self.dedup.refusal(sender, seq) is not None or self.dedup.seen(sender, seq)
                or (self.held_keys and (sender, seq) in self.held_keys)
                or self.held_inserts[table.name] or not table.can_insert(n)):
            return False
        priority = None
        if fast.priority is not None:
            dtype, offset = fast.priority
            priority = np.ndarray((n,), dtype, memoryview(payload).toreadonly(), offset)
            try:
                check_priorities(priority)
            except TableError:
                return False
        self.count("insert", "in", len(header) + fast.nbytes)
        if self.wal is None:
            table.insert_packed(fast.plan, payload, n, priority)
            self._stored(table, identity, seq, sender, ws, n, True)
        else:  # the log takes arrays
            view = memoryview(payload).toreadonly()
            arrays = {name: np.ndarray(shape, dtype, view, offset)
                      for name, dtype, shape, offset in fast.items if name != "priority"}
            self._commit(table, Peer(identity, seq, sender), arrays, priority, ws, n, True)
        self.fast_inserts += 1
        if self.held_samples[table.name] or self.held_unlimited[table.name]:
            self._pump(table)
        return True
