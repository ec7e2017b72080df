"""The round barrier of the synchronous protocol, kept by shard 0: ``barrier`` requests parked
until every live actor waits for the next round's weights.

Barrier rule, decided here and documented in docs/protocol.md: shard 0 answers
``barrier(round=k)`` when there is at least one live registered actor (role
``actor``) and every one of them has a ``wait`` parked on shard 0 whose sender
equals its ``actor_id`` and whose effective minimum version
(max(min_version, have_version + 1)) is >= k + 1. With no live actor the
barrier keeps waiting (until its timeout), so a learner cannot run ahead of
actors that have not joined yet. An actor that dies stops counting once the
registry expires it (liveness timeout). tick(), which the loop runs after each
burst of messages, looks again only when the parked waits, the members or the
barriers changed since its last look.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.server import Peer
from rlfleet.services.paramserver.long_polls import MAX_WAIT_MS, LongPolls
from rlfleet.services.paramserver.registry import Registry
from rlfleet.services.paramserver.replies import Replier

MAX_PARKED_BARRIERS = 64


@dataclass
class ParkedBarrier:
    peer: Peer
    round: int
    deadline: float
    started: float


class RoundBarrier:
    """Parked ``barrier`` requests; reads who is live (``registry``) and who waits (``long_polls``)."""

    def __init__(self, replier: Replier, registry: Registry, long_polls: LongPolls, wait_seconds: Any) -> None:
        self.replier = replier
        self.registry = registry
        self.long_polls = long_polls
        self._wait_seconds = wait_seconds  # histogram of how long each barrier request was parked
        self.parked: list[ParkedBarrier] = []
        self._looked_at: tuple[int, int, int] = (-1, -1, -1)  # changes of members, waits and barriers
        self._arrivals = 0  # barrier requests parked so far

    def __len__(self) -> int:
        return len(self.parked)

    def on_barrier(self, peer: Peer, msg: Message) -> None:
        if len(self.parked) >= MAX_PARKED_BARRIERS:
            self.replier.reply_error(peer, "busy", f"{MAX_PARKED_BARRIERS} barrier requests are already waiting",
                                     count=False)
            return
        timeout_ms = min(max(msg["timeout_ms"], 0), MAX_WAIT_MS)
        now = time.monotonic()
        self.parked.append(ParkedBarrier(peer, msg["round"], now + timeout_ms / 1000, now))
        self._arrivals += 1

    def tick(self, now: float) -> None:
        """Answer the barriers every live actor has reached, and time out the others."""
        self._answer_reached()
        timed_out = [b for b in self.parked if b.deadline <= now]
        if not timed_out:
            return
        waiting = self.long_polls.waiting_for()
        actors = self._live_actors()
        for b in timed_out:
            self.parked.remove(b)
            self._wait_seconds.observe(now - b.started)
            ready = sum(1 for a in actors if waiting.get(a, -1) >= b.round + 1)
            # The learner polls the barrier with short timeouts in normal operation: not a protocol error.
            self.replier.reply_error(b.peer, "timeout", f"barrier for round {b.round}: {ready} of {len(actors)}"
                                     f" live actors were waiting for version {b.round + 1} when it timed out",
                                     count=False)

    def _answer_reached(self) -> None:
        state = (self.registry.changes, self.long_polls.changes, self._arrivals)
        if state == self._looked_at:
            return  # nothing moved since the last look: the answer is the same
        self._looked_at = state
        if not self.parked:
            return
        actors = self._live_actors()
        if not actors:
            return
        waiting = self.long_polls.waiting_for()
        reached = min(waiting.get(a, -1) for a in actors) - 1  # every actor waits for reached + 1 or later
        now = time.monotonic()
        for b in [b for b in self.parked if b.round <= reached]:
            self.parked.remove(b)
            self._wait_seconds.observe(now - b.started)
            self.replier.reply(b.peer, Message("barrier_reply", {"round": b.round, "actors": len(actors)}))

    def _live_actors(self) -> list[str]:
        return [m.actor_id for m in self.registry.members.values() if m.role == "actor"]
