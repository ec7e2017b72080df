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

from rlfleet.common.wire.codec import DTYPES
from rlfleet.common.wire.decoder import PackedLayout
from rlfleet.common.wire.dedup import Dedup
from rlfleet.common.wire.errors import RequestError
from rlfleet.common.wire.inserts import insert_header_prefix, read_insert_tail
from rlfleet.common.wire.server import Peer
from rlfleet.services.replay.burst_replies import BurstReplies
from rlfleet.services.replay.columnar import PackedPlan, Table, TableError
from rlfleet.services.replay.held_requests import HeldRequests
from rlfleet.services.replay.insert_writer import InsertWriter
from rlfleet.services.replay.priorities import check_priorities
from rlfleet.services.replay.replier import Replier
from rlfleet.services.replay.versions import COLUMN as VERSION
from rlfleet.services.replay.versions import PublishedVersions

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
    version: tuple[np.dtype[Any], tuple[int, ...], int] | None  # the version column's dtype, shape and offset
    ruled: tuple[tuple[str, np.dtype[Any], tuple[int, ...], int], ...]  # the items whose values the table checks


@dataclass(frozen=True)
class StoredPacked:
    """A packed insert the full path stored, that asked for merged acks: what its layout is learnt from."""

    table: Table
    layout: PackedLayout
    n: int
    peer: Peer
    window_start: int | None


class FastInsertPath:
    """Owns what is remembered of each connection's usual inserts and takes those inserts from their
    frames: the server's loop offers it every message first (:meth:`take`), and shows it every packed
    insert the full path stored (:meth:`remember`, then :meth:`learn` once the message is handled)."""

    def __init__(self, loop: Replier, dedup: Dedup, held: HeldRequests, writer: InsertWriter,
                 replies: BurstReplies, versions: PublishedVersions, logged: bool) -> None:
        self.loop = loop
        self.versions = versions
        self.dedup = dedup
        self.held = held
        self.writer = writer
        self.replies = replies
        self.logged = logged  # wal: an insert goes through the log, which takes arrays
        # by ROUTER identity, then payload bytes: that connection's usual inserts
        self.layouts: dict[bytes, dict[int, FastInsert]] = {}
        self.inserts = 0  # inserts stored by this path
        self._learn_failed = False
        # by identity: the layouts of the connection's last inserts that took the full path; a layout
        # is learnt the second time it is seen (a sender whose N is new at every insert learns nothing)
        self._full_layouts: dict[bytes, list[PackedLayout]] = {}
        self._stored: StoredPacked | None = None  # of the message being handled

    def take(self, frames: list[Any]) -> bool:
        """Store ``frames`` if they are an insert of a known layout of their connection (True, answered
        as the full path would); False, with nothing done, for any message this path does not take."""
        if len(frames) != 3:
            return False
        identity = frames[0].bytes
        layouts = self.layouts.get(identity)
        fast = layouts.get(len(frames[2])) if layouts is not None else None
        if fast is None:
            return False
        try:
            return self._insert(fast, identity, frames)
        except Exception as exc:  # answered as the full path does
            tail = read_insert_tail(frames[1].bytes, len(fast.prefix))
            peer = Peer(identity, tail[1] if tail is not None else -1, fast.sender)
            if isinstance(exc, RequestError):  # e.g. wal_failed: the wal's disk is full
                self.loop.reply_error(peer, exc.reason, exc.detail, count=exc.count)
                return True
            self.layouts.pop(identity, None)
            log.exception("%s: insert failed", self.loop.name)
            self.loop.reply_error(peer, "internal", f"{type(exc).__name__}: {exc}")
            return True

    def remember(self, stored: StoredPacked) -> None:
        """The full path stored this packed insert of the message being handled (merge_acks asked)."""
        self._stored = stored

    def learn(self, frames: list[Any]) -> None:
        """After the full path handled ``frames``: learn their layout if it stored them packed."""
        stored, self._stored = self._stored, None
        if stored is None or len(frames) != 3:
            return
        try:
            self._learn(stored, frames)
        except Exception:  # a layout this path cannot take: its inserts keep the full path
            if not self._learn_failed:  # once: the same layout would fail at every insert
                self._learn_failed = True
                log.exception("%s: insert layout not memoised (its inserts take the full path)", self.loop.name)

    def _learn(self, stored: StoredPacked, frames: list[Any]) -> None:
        """Remember the header's bytes up to window_start, if they are in InsertEncoder's form."""
        table, layout, n, peer, ws = stored.table, stored.layout, stored.n, stored.peer, stored.window_start
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
        owner = self.loop.owner_suffix(frames)
        prefix = insert_header_prefix(table.name, peer.sender[:len(peer.sender) - len(owner)], descriptors)
        if not header.startswith(prefix) or read_insert_tail(header, len(prefix)) != (ws, peer.seq):
            return
        plan = table.packed_plan(items)
        if plan is None:
            return
        priority = next(((dtype, offset) for name, dtype, _, offset in items if name == "priority"), None)
        # an int column only, as PublishedVersions.problem reads it (a float "version" of an undeclared table
        # holding NaN made known() raise: an internal error and a traceback per insert)
        version = next(((dtype, shape, offset) for name, dtype, shape, offset in items
                        if name == VERSION and dtype.kind in "iu"), None)
        ruled = tuple(item for item in items if item[0] in table.values)
        layouts = self.layouts.get(identity)
        if layouts is None:
            if len(self.layouts) >= MAX_FAST_PEERS:
                self.layouts.clear()
            layouts = self.layouts[identity] = {}
        if len(layouts) >= MAX_LAYOUTS:
            layouts.clear()
        layouts[nbytes] = FastInsert(prefix, table, table.generation, n, nbytes, peer.sender, owner, plan, items,
                                     priority, version, ruled)

    def _insert(self, fast: FastInsert, identity: bytes, frames: list[Any]) -> bool:
        """Store an insert whose header is ``fast.prefix`` and two ints and whose payload has the
        size of that layout; False (nothing done) for anything else: a duplicate, a held insert,
        a bad priority, another header, ... all take the full path."""
        header, payload = frames[1].bytes, frames[2]
        table = fast.table
        prefix = fast.prefix
        loop = self.loop
        limits = loop.limits
        if (len(payload) != fast.nbytes or not header.startswith(prefix) or table.generation != fast.generation
                or len(header) > limits.max_header_bytes
                or len(header) + fast.nbytes > limits.max_message_bytes
                or (loop.bind_senders and loop.owner_suffix(frames) != fast.owner)):
            return False
        tail = read_insert_tail(header, len(prefix))
        if tail is None or tail[0] < 0:  # a window_start out of range: the full decoder refuses it
            return False
        ws, seq = tail
        sender, n = fast.sender, fast.n
        dedup, held = self.dedup, self.held
        if (dedup.refusal(sender, seq) is not None or dedup.seen(sender, seq)
                or (held.keys and (sender, seq) in held.keys)
                or held.inserts[table.name] or not table.can_insert(n)):
            return False
        priority = None
        if fast.priority is not None:
            dtype, offset = fast.priority
            priority = np.ndarray((n,), dtype, memoryview(payload).toreadonly(), offset)
            try:
                check_priorities(priority)
            except TableError:
                return False
        if fast.version is not None:  # a version above the newest known: the full path asks or refuses
            dtype, shape, offset = fast.version
            if not self.versions.known(np.ndarray(shape, dtype, memoryview(payload), offset)):
                return False
        if fast.ruled and table.value_problem({name: np.ndarray(shape, dtype, memoryview(payload), offset)
                                               for name, dtype, shape, offset in fast.ruled}) is not None:
            return False  # the full path refuses it, naming the column
        loop.count("insert", "in", len(header) + fast.nbytes)
        if not self.logged:
            table.insert_packed(fast.plan, payload, n, priority)
            dedup.add(sender, seq, ws)
            self.replies.ack_stored(table.name, identity, seq, sender, n, True)
        else:  # the log takes arrays
            view = memoryview(payload).toreadonly()
            arrays = {name: np.ndarray(shape, dtype, view, offset)
                      for name, dtype, shape, offset in fast.items if name != "priority"}
            self.writer.commit(table, Peer(identity, seq, sender), arrays, priority, ws, n, True)
        self.inserts += 1
        if held.samples[table.name] or held.unlimited[table.name]:
            held.pump(table)
        return True
