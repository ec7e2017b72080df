"""The acks and queue batches of one burst of messages, sent together after it.

The loop reads a burst of messages, then runs its tick, which calls
:meth:`BurstReplies.flush`. Acks wait for it so that, with ``wal``
durability, they go only after the fsync of what the burst appended: an
acked insert is on disk. Batches of queue tables wait the same way for the
fsync of their pop, so that a batch the learner got is never served again
after a crash. Replies sent back to back also wake ZeroMQ's I/O thread less
often.

The inserts of a burst that asked for it (``merge_acks``, as InsertClient
does) are acked with one message per sender: a message per ack costs the
server a send and the sender a receive and a decode each, which was a fifth
of the cost of an insert.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlfleet.common.wire.codec import Message, encode_header
from rlfleet.common.wire.server import Peer
from rlfleet.services.replay.replier import Replier
from rlfleet.services.replay.storage import WriteAheadLog

ACKS_PER_MESSAGE = 200  # inserts one ack message answers at most (a header list holds at most 256 items)

AckItem = tuple[int, int, bool]  # (seq, stored, duplicate) of one insert


class BurstReplies:
    """Owns what a burst will send when it ends: the acks by sender (merged) or by insert, the
    encoded replies held back for the fsync, and the items stored by table (counted as they are acked)."""

    def __init__(self, loop: Replier, wal: WriteAheadLog | None, inserts_by_table: Mapping[str, Any]) -> None:
        self.loop = loop
        self.wal = wal
        self._m_inserts = dict(inserts_by_table)  # each table's replay_inserts counter
        self.items_stored = dict.fromkeys(self._m_inserts, 0)  # since the last flush, by table
        # by (connection, sender) with merge_acks, else by (connection, sender, seq): where the ack goes
        # (the Peer of the first insert it answers: the fast path makes none) and what it answers. An ack
        # names seqs only, so the inserts of two senders sharing a connection never share one
        self.acks: dict[Any, tuple[Peer, list[AckItem]]] = {}
        self.deferred: list[tuple[Peer, list[Any], str]] = []  # encoded now, so that the sends are back to back

    def ack_stored(self, table: str, identity: bytes, seq: int, sender: str, n: int, merge: bool) -> None:
        """Queue the ack of an insert of ``n`` items stored (and logged) in ``table``."""
        self.items_stored[table] += n
        self._queue(identity, seq, sender, (seq, n, False), merge)

    def ack_duplicate(self, identity: bytes, seq: int, sender: str, merge: bool) -> None:
        """Queue the ack of an insert already stored: ``duplicate=true, stored=0``."""
        self._queue(identity, seq, sender, (seq, 0, True), merge)

    def _queue(self, identity: bytes, seq: int, sender: str, item: AckItem, merge: bool) -> None:
        key = (identity, sender) if merge else (identity, sender, seq)
        pending = self.acks.get(key)
        if pending is None:
            self.acks[key] = (Peer(identity, seq, sender), [item])
        else:
            pending[1].append(item)

    def defer(self, peer: Peer, msg: Message) -> None:
        """Send ``msg`` to ``peer`` with the burst's acks (after its fsync)."""
        self.deferred.append((peer, self.loop.reply_frames(peer, msg), msg.type))

    def flush(self) -> None:
        """Send the acks (and held-back replies) of this burst; with a log, after fsync'ing what it appended.

        Raises :class:`~rlfleet.services.replay.storage.WalError` if the fsync fails: then nothing is sent."""
        for name, n in self.items_stored.items():  # counted before the acks go: an acked insert is counted
            if n:
                self._m_inserts[name].inc(n)
                self.items_stored[name] = 0
        if self.wal is not None:
            self.wal.sync()
        loop = self.loop
        acks, self.acks = self.acks, {}
        for peer, items in acks.values():  # one ack message per sender and burst
            for i in range(0, len(items), ACKS_PER_MESSAGE):
                (seq, stored, duplicate), *more = items[i:i + ACKS_PER_MESSAGE]
                body: dict[str, Any] = {"stored": stored, "duplicate": duplicate, "ref_seq": seq}
                if more:
                    body["more"] = more  # [seq, stored, duplicate] of each further insert
                loop.send_frames(peer, [encode_header("ack", body, loop.name, next(loop.seq))], "ack")
        replies, self.deferred = self.deferred, []
        for peer, frames, mtype in replies:
            loop.send_frames(peer, frames, mtype)
