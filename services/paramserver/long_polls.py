"""The ``wait`` requests (long polls) a shard holds until a newer version or their deadline.

One per DEALER (keyed by its ROUTER identity): a DEALER that asks again ends its earlier poll.
No sockets here: :class:`~rlfleet.services.paramserver.weights_requests.WeightsRequests` answers them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rlfleet.common.wire.schema import DEFAULT_MODEL
from rlfleet.common.wire.server import Peer

MAX_PARKED_WAITS = 10_000
MAX_WAIT_MS = 600_000  # a long poll (or a barrier) is parked at most this long


@dataclass
class ParkedWait:
    peer: Peer
    min_version: int
    deadline: float
    shm: bool
    model: str = DEFAULT_MODEL


class LongPolls:
    """Parked waits by ROUTER identity, and the ``waits_parked`` gauge that counts them."""

    def __init__(self, parked_gauge: Any) -> None:
        self._waits: dict[bytes, ParkedWait] = {}
        self._gauge = parked_gauge
        # bumped whenever the parked set changes: the barrier looks again only when it moved
        self.changes = 0

    def __len__(self) -> int:
        return len(self._waits)

    @property
    def full(self) -> bool:
        return len(self._waits) >= MAX_PARKED_WAITS

    def end(self, identity: bytes) -> ParkedWait | None:
        """Remove and return the poll ``identity`` has parked, if any."""
        wait = self._waits.pop(identity, None)
        if wait is not None:
            self._changed()
        return wait

    def park(self, peer: Peer, min_version: int, timeout_ms: int, shm: bool, model: str) -> None:
        """Hold a wait for ``min_version`` or newer, at most ``timeout_ms`` (clamped to MAX_WAIT_MS)."""
        timeout_ms = min(max(timeout_ms, 0), MAX_WAIT_MS)
        self._waits[peer.identity] = ParkedWait(peer, min_version, time.monotonic() + timeout_ms / 1000, shm, model)
        self._changed()

    def woken_by(self, model: str, version: int) -> list[ParkedWait]:
        """Remove and return the waits that version ``version`` of ``model`` satisfies."""
        woken = [k for k, w in self._waits.items() if w.model == model and w.min_version <= version]
        if not woken:
            return []
        out = [self._waits.pop(k) for k in woken]
        self._changed()
        return out

    def expired(self, now: float) -> list[ParkedWait]:
        """Remove and return the waits whose deadline has passed."""
        expired = [k for k, w in self._waits.items() if w.deadline <= now]
        if not expired:
            return []
        out = [self._waits.pop(k) for k in expired]
        self._changed()
        return out

    def waiting_for(self, model: str = DEFAULT_MODEL) -> dict[str, int]:
        """Per sender, the highest minimum version among its parked waits for ``model``."""
        waiting: dict[str, int] = {}
        for w in self._waits.values():
            if w.model == model and w.min_version > waiting.get(w.peer.sender, -1):
                waiting[w.peer.sender] = w.min_version
        return waiting

    def _changed(self) -> None:
        self._gauge.set(len(self._waits))
        self.changes += 1
