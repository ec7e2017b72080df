"""The weights versions an insert may claim: from 0 to the newest the paramserver holds.

Every item carries the version of the weights it was acted with (its ``version``
column), which the learner uses to measure and bound staleness. A negative one,
or one newer than any published, is a version no actor acted with: replay
refuses the insert (``bad_value``, naming the column) rather than store what the
learner would take for fresh data.

Replay learns the newest version from paramserver shard 0, which every publish
reaches before any actor can read that version: a ``get`` with ``have_version``
2^63-1 answers ``not_modified`` with the versions the shard holds and no weights.
It asks only when an insert claims a version above the newest it knows, and it
never waits for the answer: such an insert is set aside (:meth:`defer`, as
decoded) and handled again once the answer came, against the
newest version then known, by the answer to a ``get`` sent after it came (one
sent before could tell of the versions before the one it claims was
published). At most one ``get`` is in flight, and the next goes at least
``MIN_ASK_INTERVAL_S`` after the last answer, so a flood of forged future
versions costs shard 0 at most 200 ``get``s a second, not one per insert, and
inserts claiming known versions go on meanwhile. While the
paramserver does not answer within ``ASK_TIMEOUT_S`` (or under CurveZMQ, where
replay holds no client key), an insert claiming a version above the newest
known is taken: the learner drops such items anyway
(:func:`rlfleet.common.algorithms.drop_stale`), and replay asks again ``RETRY_AFTER_S``
later. Inserts set aside beyond ``MAX_DEFERRED`` (or ``MAX_DEFERRED_BYTES``)
are judged at once against the newest known.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.schema import INT64_MAX

log = logging.getLogger(__name__)

COLUMN = "version"  # the column of the fleet's experience contract every actor fills
ASK_TIMEOUT_S = 0.5  # a get answers in well under a millisecond on one host; the loop never waits for it
RETRY_AFTER_S = 5.0  # after a get that went unanswered (or found shard 0 empty)
MIN_ASK_INTERVAL_S = 0.005  # between an answer and the next get
MAX_DEFERRED = 4096  # inserts set aside for the answer; beyond, judged at once against the newest known
MAX_DEFERRED_BYTES = 64 << 20

#: :meth:`PublishedVersions.problem`'s answer for an insert to set aside until shard 0 answers
DEFER = "defer"


class PublishedVersions:
    """The newest version published, as far as replay knows, and the check of an insert's versions."""

    def __init__(self, paramserver: str | None, sender: str, ctx: Any = None) -> None:
        self.newest = -1
        self._conn = Connection(paramserver, sender, ctx=ctx) if paramserver else None
        self._quiet_until = 0.0  # no get before this (the paramserver did not answer the last one)
        self._warned = False  # since the last answer
        self._asked: int | None = None  # the seq of the get in flight
        self._asked_at = 0.0
        self._sent = 0  # gets sent, and the number of the last one answered
        self._answered = 0
        self._next_ask_at = 0.0  # no get before this (MIN_ASK_INTERVAL_S after the last answer)
        # the inserts set aside for the answer, in order: (the number of the get that judges it, the insert, ...)
        self._deferred: list[tuple[int, Any, int]] = []  # and its bytes
        self._deferred_bytes = 0
        self.deciding = False  # while the inserts set aside are handled again: judged, never set aside again
        self.asks = 0  # gets sent (in info's stats: a flood of forged versions must not make one per insert)
        self.deferred_total = 0  # inserts set aside

    @property
    def deferred(self) -> bool:
        """Whether inserts are set aside for shard 0's answer."""
        return bool(self._deferred)

    @property
    def socket(self) -> Any:
        """The socket the answers come on (the server's loop polls it), or None."""
        return self._conn.sock if self._conn is not None else None

    def known(self, versions: np.ndarray) -> bool:
        """Whether :meth:`problem` would take ``versions`` without asking the paramserver: none negative, and
        none above the newest version known unless replay cannot ask now (it would take them then too)."""
        if versions.size == 0 or versions.dtype.kind not in "iu":  # problem() checks int columns only
            return True
        return int(versions.min()) >= 0 and (int(versions.max()) <= self.newest or not self._may_ask())

    def _may_ask(self) -> bool:
        return self._conn is not None and time.monotonic() >= self._quiet_until

    def problem(self, arrays: Mapping[str, np.ndarray]) -> str | None:
        """What is wrong with the insert's ``version`` column (None: nothing, or no such int column), or
        :data:`DEFER`: it claims a version above the newest known, and replay asks shard 0 (or will, or still
        waits for the answer): hand the insert to :meth:`defer`."""
        v = arrays.get(COLUMN)
        if v is None or v.size == 0 or v.dtype.kind not in "iu":
            return None
        low, high = int(v.min()), int(v.max())
        if low < 0:
            return (f"column {COLUMN!r} holds {low}; allowed: the version of the weights each item was acted with,"
                    f" 0 to the newest published ({self.newest if self.newest >= 0 else 'none yet'})")
        if high <= self.newest:
            return None
        if self._deferred:
            self.poll()  # the answer may be in
            if high <= self.newest:
                return None
        if not self._may_ask():
            return None  # cannot tell: taken (the learner drops it)
        if not self.deciding and len(self._deferred) < MAX_DEFERRED and self._deferred_bytes < MAX_DEFERRED_BYTES:
            return DEFER
        return (f"column {COLUMN!r} holds {high}, newer than the newest version published ({self.newest});"
                f" allowed: the version of the weights each item was acted with, 0 to {self.newest}")

    def defer(self, insert: Any, nbytes: int) -> None:
        """Keep an insert (after :meth:`problem` said :data:`DEFER`) until :meth:`released`: judged
        by the answer to a get sent after it came (one sent before may tell of a version before the one it
        claims was published), which is sent now if none is in flight and the last was not too recent."""
        sent = self._sent
        if self._asked is None:
            self._ask()
        need = self._sent if self._sent > sent else sent + 1  # the get that judges it: the one just sent, or the next
        self._deferred.append((need, insert, nbytes))
        self._deferred_bytes += nbytes
        self.deferred_total += 1

    def released(self) -> list[Any]:
        """The inserts set aside that can be judged now, in order: shard 0 answered a get sent after they
        came, or did not answer in time (they are then taken). Handle each again with :attr:`deciding` set.
        Sends the get they wait for once it is due. Never waits."""
        if not self._deferred:
            return []
        self.poll()
        deferred = self._deferred
        if not self._may_ask():  # shard 0 did not answer: all are taken
            n = len(deferred)
        else:
            n = 0
            while n < len(deferred) and deferred[n][0] <= self._answered:
                n += 1
            if n < len(deferred) and self._asked is None:
                self._ask()  # the rest wait for a get not yet sent
        if not n:
            return []
        out = deferred[:n]
        del deferred[:n]
        self._deferred_bytes -= sum(nbytes for _, _, nbytes in out)
        return [insert for _, insert, _ in out]

    def _ask(self) -> None:
        """Send shard 0 a get for its versions unless one is in flight or the last answer is too recent (a
        flood of forged versions costs shard 0 at most one get per ``MIN_ASK_INTERVAL_S``); never waits."""
        now = time.monotonic()
        if self._asked is not None or self._conn is None or now < self._next_ask_at:
            return
        seq = self._conn.try_send(Message("get", {"have_version": INT64_MAX}))
        if seq is None:  # its queue is full: the paramserver is gone
            self._unanswered("its send queue is full")
            return
        self._asked, self._asked_at = seq, now
        self._sent += 1
        self.asks += 1

    def poll(self) -> None:
        """Read shard 0's answers without waiting; give up on a get unanswered for ``ASK_TIMEOUT_S``."""
        conn = self._conn
        if conn is None:
            return
        for reply in conn.replies():
            ref = reply.get("ref_seq")
            if reply.type == "error":
                if ref == self._asked:
                    self._unanswered(f"{reply.get('reason')}: {reply.get('detail')}")
                continue
            held = [v for v in reply.body.get("versions", []) if type(v) is int]
            if held:  # any answer tells what the shard held, a late one too
                self.newest = max(self.newest, *held)
                self._warned = False
            if ref == self._asked:
                self._asked = None
                self._answered = self._sent
                self._next_ask_at = time.monotonic() + MIN_ASK_INTERVAL_S
                if not held:  # a shard that holds nothing (just restarted) cannot tell: ask again later
                    self._quiet_until = time.monotonic() + RETRY_AFTER_S
        if self._asked is not None and time.monotonic() - self._asked_at > ASK_TIMEOUT_S:
            self._unanswered(f"no answer within {ASK_TIMEOUT_S} s")

    def _unanswered(self, why: str) -> None:
        self._asked = None
        self._quiet_until = time.monotonic() + RETRY_AFTER_S
        if not self._warned:
            self._warned = True
            log.warning("replay: the paramserver did not say its newest version (%s): inserts claiming a"
                        " newer version than %d are taken until it does", why, self.newest)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
