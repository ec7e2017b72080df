"""The registry of live actors, kept by paramserver shard 0.

Each live actor (role ``actor``) holds an index 0..N-1, used for Ape-X
per-actor exploration: stable while the actor lives, and the lowest free
index goes to the next actor that joins, so indices of departed actors are
reused. Evaluators are tracked but hold index -1 and never count for the
barrier or for N. The free indices below the highest ever given are kept in a
heap, so a join costs O(log n), not a scan of the members.

The registry holds at most ``max_members`` members (``paramserver.max_members``,
10,000 by default): a ``hello`` or ``heartbeat`` that would register one more
is refused with ``too_many_members``, naming the limit, until members leave or
expire. A flood of ``hello``s under new ids cannot grow it past that.

An actor is live from its ``hello`` (or a ``heartbeat`` after it expired)
until its ``goodbye``, or until it has been silent for the liveness timeout.
Signs of life: its ``hello`` and ``heartbeat``, and any ``get`` or ``wait``
on shard 0 whose header ``sender`` is its ``actor_id`` (the shard calls
:meth:`Registry.touch` for those two). Nothing else (``barrier``, ``info``,
``publish``, ``goodbye``) refreshes a member.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlfleet.common.roles import REGISTERED
from rlfleet.common.wire.schema import INT64_MAX

log = logging.getLogger(__name__)

ROLES = REGISTERED  # actor, evaluator
MAX_ACTOR_ID = 256
DEFAULT_MAX_MEMBERS = 10_000
MAX_STEP_REPORTERS = 100_000  # actor ids whose env steps count in fleet_env_steps


class BadMember(ValueError):
    """A hello or heartbeat the registry refuses; ``reason`` is the error reason on the wire."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass
class Member:
    actor_id: str
    role: str
    index: int
    last_seen: float
    version: int = -1


class Registry:
    """Who is alive, with what index. Not thread-safe: the shard loop owns it."""

    def __init__(self, liveness_s: float, clock: Callable[[], float] = time.monotonic,
                 max_members: int = DEFAULT_MAX_MEMBERS) -> None:
        self.liveness_s = liveness_s
        self.clock = clock
        self.max_members = max_members
        self.members: dict[str, Member] = {}
        self._num_actors = 0
        self._next_index = 0  # every index below is held by a live actor or in _free
        self._free: list[int] = []  # a heap: indices below _next_index that no live actor holds
        # bumped whenever someone joins or leaves: the barrier looks again only when it moved
        self.changes = 0
        # env steps each actor id reported; kept after it leaves so the fleet total never drops
        self._steps: dict[str, int] = {}
        self._steps_before_restart: dict[str, int] = {}
        self._steps_total = 0  # the sum of both, kept as they change (a welcome does not add them up)
        self.step_changes = 0  # bumped whenever the env-step table changes: what is worth writing to disk

    # -- queries ------------------------------------------------------------
    @property
    def actors(self) -> list[Member]:
        """Live members with role actor, by index."""
        return sorted((m for m in self.members.values() if m.role == "actor"), key=lambda m: m.index)

    @property
    def num_actors(self) -> int:
        return self._num_actors

    def get(self, actor_id: str) -> Member | None:
        return self.members.get(actor_id)

    @property
    def fleet_env_steps(self) -> int:
        """Env steps of every actor that ever reported, restarts included; saturated at the wire's
        int64 range, so reports that add up past it cannot break ``welcome`` for every actor."""
        return min(INT64_MAX, self._steps_total)

    def step_counts(self) -> dict[str, dict[str, int]]:
        """The env-step table: each actor id's own last total, and what it counted before its restarts
        (what a restarted shard 0 restores with :meth:`restore_step_counts`, so the fleet's count goes on)."""
        return {"steps": dict(self._steps), "before_restart": dict(self._steps_before_restart)}

    def restore_step_counts(self, counts: dict[str, dict[str, int]]) -> None:
        """Take a table :meth:`step_counts` gave (its own file, read back: every entry checked); ValueError,
        nothing changed, for one that is not such a table."""
        tables = []
        for key in ("steps", "before_restart"):
            table = counts.get(key) if isinstance(counts, dict) else None
            if not isinstance(table, dict) or len(table) > MAX_STEP_REPORTERS or not all(
                    isinstance(k, str) and type(v) is int and 0 <= v <= INT64_MAX for k, v in table.items()):
                raise ValueError(f"{key!r}: not a table of actor ids to env steps (0..{INT64_MAX}), at most "
                                 f"{MAX_STEP_REPORTERS} entries")
            tables.append(dict(table))
        self._steps, self._steps_before_restart = tables
        self._steps_total = sum(self._steps.values()) + sum(self._steps_before_restart.values())
        self.step_changes += 1

    # -- changes ------------------------------------------------------------
    def report_steps(self, actor_id: str, env_steps: int) -> None:
        """An actor's own total; a smaller one than before means it restarted from 0."""
        old = self._steps.get(actor_id, 0)
        if env_steps == old and actor_id in self._steps:
            return
        if env_steps < old:
            self._steps_before_restart[actor_id] = self._steps_before_restart.get(actor_id, 0) + old
            self._steps_total += old
        if len(self._steps) < MAX_STEP_REPORTERS or actor_id in self._steps:
            self._steps[actor_id] = env_steps
            self._steps_total += env_steps - old
        self.step_changes += 1

    def _take_index(self) -> int:
        """The lowest index no live actor holds, now held."""
        self._num_actors += 1
        if self._free:
            return heapq.heappop(self._free)
        self._next_index += 1
        return self._next_index - 1

    def _removed(self, member: Member) -> None:
        if member.role == "actor":
            self._num_actors -= 1
            heapq.heappush(self._free, member.index)

    def join(self, actor_id: str, role: str, version: int = -1) -> tuple[Member, bool]:
        """Register or refresh ``actor_id``; returns (member, newly_registered).

        Raises BadMember (reason ``bad_role``, ``bad_actor_id`` or ``too_many_members``).
        """
        if role not in ROLES:
            raise BadMember("bad_role", f"role {role!r} is not one of {list(ROLES)}")
        if not 0 < len(actor_id) <= MAX_ACTOR_ID:
            raise BadMember("bad_actor_id", f"actor_id must be 1 to {MAX_ACTOR_ID} characters")
        now = self.clock()
        member = self.members.get(actor_id)
        if member is not None and member.role == role:
            member.last_seen = now
            member.version = max(member.version, version)
            return member, False
        if member is not None:  # role changed: leave, then join afresh
            del self.members[actor_id]
            self._removed(member)
        elif len(self.members) >= self.max_members:
            raise BadMember("too_many_members", f"the registry holds {self.max_members} live members"
                            f" (paramserver.max_members); allowed: a new member once one leaves or is silent for"
                            f" {self.liveness_s:g} s")
        index = self._take_index() if role == "actor" else -1
        member = Member(actor_id, role, index, now, version)
        self.members[actor_id] = member
        self.changes += 1
        return member, True

    def touch(self, actor_id: str) -> None:
        """A sign of life from ``actor_id`` (only refreshes a live member)."""
        member = self.members.get(actor_id)
        if member is not None:
            member.last_seen = self.clock()

    def leave(self, actor_id: str) -> Member | None:
        member = self.members.pop(actor_id, None)
        if member is not None:
            self.changes += 1
            self._removed(member)
        return member

    def expire(self) -> list[Member]:
        """Remove and return the members silent for longer than the liveness timeout."""
        deadline = self.clock() - self.liveness_s
        gone = [m for m in self.members.values() if m.last_seen < deadline]
        if gone:
            self.changes += 1
        for m in gone:
            del self.members[m.actor_id]
            self._removed(m)
            log.warning(
                "%s %r (index %d) sent nothing for %.1f s: removed from the registry",
                m.role, m.actor_id, m.index, self.clock() - m.last_seen,
            )
        return gone
