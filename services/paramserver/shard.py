"""One parameter-server shard: versioned weights, polls, long polls; on shard 0
also the actor registry and the round barrier.

The shard keeps the last two versions of its slice. Stored tensors are the
read-only views of the frames the publish arrived in, and replies send those
same buffers (zero-copy both ways).

Barrier rule (synchronous protocol), decided here and documented in
docs/protocol.md: shard 0 answers ``barrier(round=k)`` when there is at least
one live registered actor (role ``actor``) and every one of them has a
``wait`` parked on shard 0 whose sender equals its ``actor_id`` and whose
effective minimum version (max(min_version, have_version + 1)) is >= k + 1.
With no live actor the barrier keeps waiting (until its timeout), so a
learner cannot run ahead of actors that have not joined yet. An actor that
dies stops counting once the registry expires it (liveness timeout).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.metrics import ServiceMetrics
from common.partition import Layout
from common.protocol import Message
from common.server import Peer, RequestError, Server
from services.paramserver import shm as shmlib
from services.paramserver.registry import ROLES, Registry

log = logging.getLogger(__name__)

KEEP_VERSIONS = 2
MAX_PARKED_WAITS = 10_000
MAX_WAIT_MS = 600_000


@dataclass
class Held:
    version: int
    arrays: dict[str, np.ndarray]
    layout: str


@dataclass
class ParkedWait:
    peer: Peer
    min_version: int
    deadline: float
    shm: bool


@dataclass
class ParkedBarrier:
    peer: Peer
    round: int
    deadline: float
    started: float


class ShardServer(Server):
    """A ROUTER loop serving one shard of the weights."""

    def __init__(
        self,
        metrics: ServiceMetrics,
        bind: str,
        shard: int,
        num_shards: int,
        liveness_s: float,
        shm: bool = True,
        **kw: Any,
    ) -> None:
        super().__init__(metrics, bind, **kw)
        self.shm: shmlib.ShmExporter | None = None
        if shm and shmlib.available():
            try:
                self.shm = shmlib.ShmExporter(shard)
            except OSError as exc:
                log.warning("shared memory for same-host readers is off: %s", exc)
        self.shard = shard
        self.num_shards = num_shards
        self.layout: Layout | None = None
        self.held: list[Held] = []  # newest first
        self.waits: dict[bytes, ParkedWait] = {}  # by ROUTER identity: one long poll per DEALER
        self.barriers: list[ParkedBarrier] = []
        self.registry = Registry(liveness_s) if shard == 0 else None
        m = metrics
        self.m_version = m.gauge("paramserver_version", "Newest weights version held by this shard (-1: none).")
        self.m_version.set(-1)
        self.m_publishes = m.counter("paramserver_publishes", "Versions stored by this shard.")
        self.m_gets = m.counter("paramserver_gets", "get requests served.")
        self.m_waits = m.counter("paramserver_waits", "wait (long poll) requests received.")
        self.m_weights = m.counter("paramserver_weights_served", "weights replies sent (get and wait).")
        self.m_not_modified = m.counter("paramserver_not_modified", "not_modified replies sent (get and wait).")
        self.m_parked = m.gauge("paramserver_waits_parked", "Long polls waiting for a newer version.")
        self.m_actors = m.gauge("paramserver_live_actors", "Live registered actors (shard 0).")
        self.m_barrier = m.histogram(
            "paramserver_barrier_wait_seconds", "Time a barrier request waited for the actors (shard 0).",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        for mtype, handler in (("publish", self.on_publish), ("get", self.on_get), ("wait", self.on_wait),
                               ("info", self.on_info)):
            self.route(mtype, handler)
        if self.registry is not None:
            for mtype, handler in (("hello", self.on_hello), ("heartbeat", self.on_heartbeat),
                                   ("goodbye", self.on_goodbye), ("barrier", self.on_barrier)):
                self.route(mtype, handler)

    # -- weights ------------------------------------------------------------
    @property
    def versions(self) -> list[int]:
        return [h.version for h in self.held]

    def _layout_of(self, msg: Message) -> Layout:
        fp = msg["layout"]
        if msg["num_shards"] != self.num_shards:
            raise RequestError("layout_mismatch", f"publish is split across {msg['num_shards']} shards; "
                               f"this paramserver has {self.num_shards}")
        if self.layout is not None:
            if fp != self.layout.fingerprint:
                raise RequestError("layout_mismatch", f"publish has layout {fp}; this shard holds layout "
                                   f"{self.layout.fingerprint} (a new model needs a fresh paramserver)")
            return self.layout
        try:
            layout = Layout.from_wire(msg.get("tensors") or [], self.num_shards)
        except ValueError as exc:
            raise RequestError("layout_mismatch", f"publish.tensors: {exc}") from None
        if layout.fingerprint != fp:
            raise RequestError("layout_mismatch", f"publish.layout {fp} is not the fingerprint of "
                               f"publish.tensors ({layout.fingerprint})")
        return layout

    def on_publish(self, peer: Peer, msg: Message) -> None:
        version = msg["version"]
        if self.held and version <= self.held[0].version:
            raise RequestError("stale_version", f"version {version} is not newer than version "
                               f"{self.held[0].version} held by shard {self.shard}")
        if version < 0:
            raise RequestError("stale_version", f"version {version} is negative")
        layout = self._layout_of(msg)
        problem = layout.check_shard(self.shard, msg.arrays)
        if problem:
            raise RequestError("layout_mismatch", problem)
        if self.layout is None:
            log.info("%s: layout %s, %d tensors on this shard (%d bytes)", self.name, layout.fingerprint,
                     len(layout.shards[self.shard]), layout.shard_nbytes(self.shard))
        self.layout = layout
        held = Held(version, dict(msg.arrays), layout.fingerprint)
        self.held = [held, *self.held]
        for old in self.held[KEEP_VERSIONS:]:
            if self.shm is not None:
                self.shm.drop(old.version)
        del self.held[KEEP_VERSIONS:]
        self.m_version.set(version)
        self.m_publishes.inc()
        self.reply(peer, Message("publish_ack", {"version": version}))
        for identity, w in list(self.waits.items()):
            if w.min_version <= version:
                del self.waits[identity]
                self._send_weights(w.peer, held, w.shm)
        self.m_parked.set(len(self.waits))

    def _send_weights(self, peer: Peer, held: Held, shm: bool = False) -> None:
        body: dict[str, Any] = {"version": held.version, "versions": self.versions, "layout": held.layout}
        self.m_weights.inc()
        if shm and self.shm is not None:
            body["shm"] = self.shm.export(held.version, held.arrays)
            self.reply(peer, Message("weights", body))
        else:
            self.reply(peer, Message("weights", body, held.arrays))

    def _send_not_modified(self, peer: Peer) -> None:
        self.m_not_modified.inc()
        self.reply(peer, Message("not_modified", {"versions": self.versions}))

    def _touch(self, msg: Message) -> None:
        if self.registry is not None and msg.sender:
            self.registry.touch(msg.sender)

    def on_get(self, peer: Peer, msg: Message) -> None:
        self._touch(msg)
        self.m_gets.inc()
        have = msg["have_version"]
        exact = msg.get("version")
        if exact is not None:
            held = next((h for h in self.held if h.version == exact), None)
            if held is None:
                raise RequestError("version_gone", f"shard {self.shard} holds versions {self.versions}; "
                                   f"{exact} is not one of them")
        else:
            held = self.held[0] if self.held else None
        if held is None or held.version <= have:
            self._send_not_modified(peer)
        else:
            self._send_weights(peer, held, bool(msg.get("shm")))

    def on_wait(self, peer: Peer, msg: Message) -> None:
        self._touch(msg)
        self.m_waits.inc()
        have = msg.get("have_version")
        want = max(msg["min_version"], -1 if have is None else have + 1)
        if self.held and self.held[0].version >= want:
            self._send_weights(peer, self.held[0], bool(msg.get("shm")))
            return
        timeout_ms = min(max(msg["timeout_ms"], 0), MAX_WAIT_MS)
        old = self.waits.pop(peer.identity, None)
        if old is not None:  # the same DEALER asks again: its earlier poll is over
            self._send_not_modified(old.peer)
        if len(self.waits) >= MAX_PARKED_WAITS:
            raise RequestError("busy", f"{MAX_PARKED_WAITS} long polls are already waiting on this shard")
        self.waits[peer.identity] = ParkedWait(peer, want, time.monotonic() + timeout_ms / 1000, bool(msg.get("shm")))
        self.m_parked.set(len(self.waits))
        self._check_barriers()

    def on_info(self, peer: Peer, msg: Message) -> None:
        stats: dict[str, Any] = {
            "versions": self.versions,
            "layout": self.layout.fingerprint if self.layout else "",
            "num_shards": self.num_shards,
            "waits_parked": len(self.waits),
            "shm": self.shm is not None,
        }
        if self.registry is not None:
            stats["actors"] = [[m.actor_id, m.role, m.index] for m in self.registry.members.values()][:200]
            stats["num_actors"] = self.registry.num_actors
            stats["barriers_waiting"] = len(self.barriers)
        self.reply(peer, Message("info_reply", {"service": "paramserver", "shard": self.shard, "stats": stats}))

    # -- registry (shard 0) -------------------------------------------------
    def _welcome(self, peer: Peer, index: int) -> None:
        assert self.registry is not None
        self.m_actors.set(self.registry.num_actors)
        body = {"index": index, "num_actors": self.registry.num_actors,
                "liveness_ms": int(self.registry.liveness_s * 1000),
                "fleet_env_steps": self.registry.fleet_env_steps}
        self.reply(peer, Message("welcome", body))

    def _join(self, peer: Peer, msg: Message, version: int) -> None:
        assert self.registry is not None
        actor_id, role = msg["actor_id"], msg["role"]
        if role not in ROLES:
            raise RequestError("bad_role", f"role {role!r} is not one of {list(ROLES)}")
        if not 0 < len(actor_id) <= 256:
            raise RequestError("bad_actor_id", "actor_id must be 1 to 256 characters")
        member, new = self.registry.join(actor_id, role, version)
        if new:
            how = "joined" if msg.type == "hello" else "re-registered by heartbeat"
            log.info("%s: %s %r %s with index %d (%d live actors)", self.name, role, actor_id, how,
                     member.index, self.registry.num_actors)
        self._welcome(peer, member.index)

    def on_hello(self, peer: Peer, msg: Message) -> None:
        self._join(peer, msg, -1)

    def on_heartbeat(self, peer: Peer, msg: Message) -> None:
        steps = msg.get("env_steps")
        if steps is not None and msg["role"] == "actor":
            assert self.registry is not None
            self.registry.report_steps(msg["actor_id"], max(0, steps))
        self._join(peer, msg, msg["version"])

    def on_goodbye(self, peer: Peer, msg: Message) -> None:
        assert self.registry is not None
        member = self.registry.leave(msg["actor_id"])
        if member is not None:
            log.info("%s: %s %r (index %d) said goodbye (%d live actors)", self.name, member.role,
                     member.actor_id, member.index, self.registry.num_actors)
        self._welcome(peer, -1)
        self._check_barriers()

    # -- barrier (shard 0) --------------------------------------------------
    def on_barrier(self, peer: Peer, msg: Message) -> None:
        timeout_ms = min(max(msg["timeout_ms"], 0), MAX_WAIT_MS)
        now = time.monotonic()
        self.barriers.append(ParkedBarrier(peer, msg["round"], now + timeout_ms / 1000, now))
        self._check_barriers()

    def _check_barriers(self) -> None:
        if not self.barriers or self.registry is None:
            return
        actors = self.registry.actors
        waiting: dict[str, int] = {}
        for w in self.waits.values():
            waiting[w.peer.sender] = max(waiting.get(w.peer.sender, -1), w.min_version)
        now = time.monotonic()
        for b in list(self.barriers):
            if actors and all(waiting.get(m.actor_id, -1) >= b.round + 1 for m in actors):
                self.barriers.remove(b)
                self.m_barrier.observe(now - b.started)
                self.reply(b.peer, Message("barrier_reply", {"round": b.round, "actors": len(actors)}))

    # -- timers -------------------------------------------------------------
    def tick(self) -> None:
        now = time.monotonic()
        expired = [k for k, w in self.waits.items() if w.deadline <= now]
        for k in expired:
            self._send_not_modified(self.waits.pop(k).peer)
        if expired:
            self.m_parked.set(len(self.waits))
        if self.shm is not None and self.shm.spare is None and self.shm.last_size:
            try:
                self.shm.prepare_spare()
            except OSError as exc:  # /dev/shm full: the next export allocates as it goes
                log.warning("%s: could not prepare a shared-memory file: %s", self.name, exc)
        if self.registry is None:
            return
        if self.registry.expire():
            self.m_actors.set(self.registry.num_actors)
        for b in [b for b in self.barriers if b.deadline <= now]:
            self.barriers.remove(b)
            self.m_barrier.observe(now - b.started)
            n = self.registry.num_actors
            waiting = {w.peer.sender for w in self.waits.values() if w.min_version >= b.round + 1}
            ready = sum(1 for m in self.registry.actors if m.actor_id in waiting)
            self.reply_error(b.peer, "timeout", f"barrier for round {b.round}: {ready} of {n} live actors "
                             f"were waiting for version {b.round + 1} when it timed out")
        self._check_barriers()


    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()
        super().close()
