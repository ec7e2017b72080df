"""Shard 0's part in coordinating the fleet: the actor registry's requests (hello,
heartbeat, goodbye) and the round barrier of the synchronous protocol.

Barrier rule, decided here and documented in docs/protocol.md: shard 0 answers
``barrier(round=k)`` when there is at least one live registered actor (role
``actor``) and every one of them has a ``wait`` parked on shard 0 whose sender
equals its ``actor_id`` and whose effective minimum version
(max(min_version, have_version + 1)) is >= k + 1. With no live actor the
barrier keeps waiting (until its timeout), so a learner cannot run ahead of
actors that have not joined yet. An actor that dies stops counting once the
registry expires it (liveness timeout). Handlers only mark the barriers "dirty"
when waits, members or barriers change; tick(), which the loop runs after each
burst of messages, checks them once per burst.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.wire.codec import Message
from common.wire.errors import RequestError
from common.wire.schema import DEFAULT_MODEL
from common.wire.server import Peer, Server
from services.paramserver.registry import BadMember, Registry

if TYPE_CHECKING:
    from services.paramserver.models import ParkedWait

log = logging.getLogger(__name__)

MAX_WAIT_MS = 600_000  # a long poll or a barrier is parked at most this long
MAX_PARKED_BARRIERS = 64


@dataclass
class ParkedBarrier:
    peer: Peer
    round: int
    deadline: float
    started: float


class CoordinatingServer(Server):
    """The registry and barrier handlers of :class:`services.paramserver.shard.ShardServer`
    (routed on shard 0 only), which sets up their state; the barrier reads its parked waits."""

    registry: Registry | None
    waits: dict[bytes, ParkedWait]  # by ROUTER identity: one long poll per DEALER
    barriers: list[ParkedBarrier]
    _barriers_dirty: bool  # waits, members or barriers changed since the last check
    m_actors: Any
    m_barrier: Any

    # -- registry (shard 0) -------------------------------------------------
    def _welcome(self, peer: Peer, index: int) -> None:
        assert self.registry is not None
        self.m_actors.set(self.registry.num_actors)
        body = {"index": index, "num_actors": self.registry.num_actors,
                "liveness_ms": int(self.registry.liveness_s * 1000),
                "fleet_env_steps": self.registry.fleet_env_steps}
        self.reply(peer, Message("welcome", body))

    def _join(self, msg: Message, version: int) -> int:
        """Register or refresh the member ``msg`` names; returns its index."""
        assert self.registry is not None
        actor_id, role = msg["actor_id"], msg["role"]
        try:
            member, new = self.registry.join(actor_id, role, version)
        except BadMember as exc:
            raise RequestError(exc.reason, str(exc)) from None
        if new:
            self._barriers_dirty = True
            how = "joined" if msg.type == "hello" else "re-registered by heartbeat"
            log.info("%s: %s %r %s with index %d (%d live actors)", self.name, role, actor_id, how,
                     member.index, self.registry.num_actors)
        return member.index

    def on_hello(self, peer: Peer, msg: Message) -> None:
        self._welcome(peer, self._join(msg, -1))

    def on_heartbeat(self, peer: Peer, msg: Message) -> None:
        index = self._join(msg, msg["version"])
        steps = msg.get("env_steps")
        if steps is not None and msg["role"] == "actor":
            assert self.registry is not None
            self.registry.report_steps(msg["actor_id"], max(0, steps))
        self._welcome(peer, index)

    def on_goodbye(self, peer: Peer, msg: Message) -> None:
        assert self.registry is not None
        member = self.registry.leave(msg["actor_id"])
        if member is not None:
            log.info("%s: %s %r (index %d) said goodbye (%d live actors)", self.name, member.role,
                     member.actor_id, member.index, self.registry.num_actors)
            self._barriers_dirty = True
        self._welcome(peer, -1)

    # -- barrier (shard 0) --------------------------------------------------
    def on_barrier(self, peer: Peer, msg: Message) -> None:
        if len(self.barriers) >= MAX_PARKED_BARRIERS:
            self.reply_error(peer, "busy", f"{MAX_PARKED_BARRIERS} barrier requests are already waiting",
                             count=False)
            return
        timeout_ms = min(max(msg["timeout_ms"], 0), MAX_WAIT_MS)
        now = time.monotonic()
        self.barriers.append(ParkedBarrier(peer, msg["round"], now + timeout_ms / 1000, now))
        self._barriers_dirty = True

    def _waiting_for(self) -> dict[str, int]:
        """Per sender, the highest effective minimum version among its parked waits (default model only)."""
        waiting: dict[str, int] = {}
        for w in self.waits.values():
            if w.model == DEFAULT_MODEL and w.min_version > waiting.get(w.peer.sender, -1):
                waiting[w.peer.sender] = w.min_version
        return waiting

    def _check_barriers(self) -> None:
        """Answer the barriers every live actor has reached (only when something changed)."""
        if not self._barriers_dirty or self.registry is None:
            return
        self._barriers_dirty = False
        if not self.barriers:
            return
        actors = [m.actor_id for m in self.registry.members.values() if m.role == "actor"]
        if not actors:
            return
        waiting = self._waiting_for()
        reached = min(waiting.get(a, -1) for a in actors) - 1  # every actor waits for reached + 1 or later
        now = time.monotonic()
        for b in [b for b in self.barriers if b.round <= reached]:
            self.barriers.remove(b)
            self.m_barrier.observe(now - b.started)
            self.reply(b.peer, Message("barrier_reply", {"round": b.round, "actors": len(actors)}))

    def _tick_coordination(self, now: float) -> None:
        """Expire silent members, answer the barriers now reached and time out the others."""
        assert self.registry is not None
        if self.registry.expire():
            self.m_actors.set(self.registry.num_actors)
            self._barriers_dirty = True
        self._check_barriers()
        timed_out = [b for b in self.barriers if b.deadline <= now]
        if not timed_out:
            return
        waiting = self._waiting_for()
        actors = [m.actor_id for m in self.registry.members.values() if m.role == "actor"]
        for b in timed_out:
            self.barriers.remove(b)
            self.m_barrier.observe(now - b.started)
            ready = sum(1 for a in actors if waiting.get(a, -1) >= b.round + 1)
            # The learner polls the barrier with short timeouts in normal operation: not a protocol error.
            self.reply_error(b.peer, "timeout", f"barrier for round {b.round}: {ready} of {len(actors)} live "
                             f"actors were waiting for version {b.round + 1} when it timed out", count=False)
