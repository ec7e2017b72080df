"""The weights versions an insert may claim: from 0 to the newest the paramserver holds.

Every item carries the version of the weights it was acted with (its ``version``
column), which the learner uses to measure and bound staleness. A negative one,
or one newer than any published, is a version no actor acted with: replay
refuses the insert (``bad_value``, naming the column) rather than store what the
learner would take for fresh data.

Replay learns the newest version from paramserver shard 0, which every publish
reaches before any actor can read that version: a ``get`` with ``have_version``
2^63-1 answers ``not_modified`` with the versions the shard holds and no weights.
It asks only when an insert claims a version above the newest it knows, so once
per published version (a few hundred microseconds on the loop), and a forged
future version costs one such ``get``. While the paramserver does not answer
(or under CurveZMQ, where replay holds no client key), an insert claiming a
version above the newest known is taken: the learner drops such items anyway
(:func:`common.algorithms.drop_stale`), and replay asks again 5 s later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from common.wire.codec import Message
from common.wire.connection import Connection
from common.wire.errors import CommTimeout, RemoteError
from common.wire.schema import INT64_MAX

log = logging.getLogger(__name__)

COLUMN = "version"  # the column of the fleet's experience contract every actor fills
ASK_TIMEOUT_S = 0.05  # a get answers in well under a millisecond on one host
RETRY_AFTER_S = 5.0  # after a get that went unanswered (the loop waited ASK_TIMEOUT_S for it)


class PublishedVersions:
    """The newest version published, as far as replay knows, and the check of an insert's versions."""

    def __init__(self, paramserver: str | None, sender: str, ctx: Any = None) -> None:
        self.newest = -1
        self._conn = Connection(paramserver, sender, ctx=ctx) if paramserver else None
        self._quiet_until = 0.0  # no get before this (the paramserver did not answer the last one)
        self._warned = False  # since the last answer

    def known(self, versions: np.ndarray) -> bool:
        """Whether :meth:`problem` would take ``versions`` without asking the paramserver: none negative, and
        none above the newest version known unless replay cannot ask now (it would take them then too)."""
        if versions.size == 0 or versions.dtype.kind not in "iu":  # problem() checks int columns only
            return True
        return int(versions.min()) >= 0 and (int(versions.max()) <= self.newest or not self._may_ask())

    def _may_ask(self) -> bool:
        return self._conn is not None and time.monotonic() >= self._quiet_until

    def problem(self, arrays: Mapping[str, np.ndarray]) -> str | None:
        """What is wrong with the insert's ``version`` column (None: nothing, or no such int column)."""
        v = arrays.get(COLUMN)
        if v is None or v.size == 0 or v.dtype.kind not in "iu":
            return None
        low, high = int(v.min()), int(v.max())
        if low < 0:
            return (f"column {COLUMN!r} holds {low}; allowed: the version of the weights each item was acted with,"
                    f" 0 to the newest published ({self.newest if self.newest >= 0 else 'none yet'})")
        if high <= self.newest or not self._ask() or high <= self.newest:
            return None
        return (f"column {COLUMN!r} holds {high}, newer than the newest version published ({self.newest});"
                f" allowed: the version of the weights each item was acted with, 0 to {self.newest}")

    def _ask(self) -> bool:
        """Ask shard 0 for its newest version; False if it could not tell."""
        if self._conn is None or not self._may_ask():
            return False
        try:
            reply = self._conn.request(Message("get", {"have_version": INT64_MAX}), ASK_TIMEOUT_S)
        except (CommTimeout, RemoteError) as exc:
            self._quiet_until = time.monotonic() + RETRY_AFTER_S
            if not self._warned:
                self._warned = True
                log.warning("replay: the paramserver did not say its newest version (%s): inserts claiming a"
                            " newer version than %d are taken until it does", exc, self.newest)
            return False
        held = [v for v in reply.body.get("versions", []) if type(v) is int]
        if not held:  # a shard that holds nothing (just restarted) cannot tell: ask again later, not per insert
            self._quiet_until = time.monotonic() + RETRY_AFTER_S
            return False
        self._warned = False
        self.newest = max(self.newest, *held)
        return True

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
