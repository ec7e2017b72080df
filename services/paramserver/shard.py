"""One parameter-server shard: versioned weights, polls, long polls; on shard 0
also the actor registry and the round barrier (services/paramserver/coordination.py).

The shard keeps the last two versions of its slice. Stored tensors are the
read-only views of the frames the publish arrived in (or of the publisher's
shared-memory file, which the shard then serves as that version's file): no
copy on the way in; replies copy them into each message (common.wire.transport.send_parts:
a file's buffer is reused once its version is dropped).

Expected outcomes (a barrier's timeout, ``version_gone`` while publishes race
a reader, ``busy``) are not counted as protocol errors.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from common import weights_shm as shmlib
from common.config.sections import GradientsConfig
from common.metrics import ServiceMetrics
from common.tensor_shards import Layout
from common.wire.codec import Message
from common.wire.errors import RequestError
from common.wire.server import Peer
from services.paramserver.coordination import MAX_WAIT_MS, CoordinatingServer, ParkedBarrier
from services.paramserver.gradients import GradientApplier, Refusal
from services.paramserver.registry import Registry
from services.paramserver.shm_versions import ShmVersions

log = logging.getLogger(__name__)

KEEP_VERSIONS = 2
MAX_PARKED_WAITS = 10_000


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


class ShardServer(ShmVersions, CoordinatingServer):
    """A ROUTER loop serving one shard of the weights.

    ``shm_dir`` is where version files go; readers map only
    /dev/shm/rlfleet-ps-*, so another directory is only useful to tests (e.g.
    one that disappears, to make every export fail).
    """

    def __init__(
        self,
        metrics: ServiceMetrics,
        bind: str,
        shard: int,
        num_shards: int,
        liveness_s: float,
        shm: bool = True,
        shm_dir: str = shmlib.SHM_DIR,
        gradients: GradientsConfig | None = None,
        checkpoint: str | None = None,
        experiment: str = "",
        **kw: Any,
    ) -> None:
        super().__init__(metrics, bind, **kw)
        self._init_shm(shard, shm, shm_dir)
        self.shard = shard
        self.num_shards = num_shards
        self.layout: Layout | None = None
        self.held: list[Held] = []  # newest first
        self.waits: dict[bytes, ParkedWait] = {}  # by ROUTER identity: one long poll per DEALER
        self.barriers: list[ParkedBarrier] = []
        self._barriers_dirty = False  # waits, members or barriers changed since the last check
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
        self.m_pushes = m.counter("paramserver_gradients_applied", "Gradient pushes applied to this shard's slice.")
        self.m_refused = m.counter("paramserver_gradients_refused", "Gradient pushes refused (nothing applied), by"
                                   " reason: stale_gradients, bad_gradients, layout_mismatch, ...", ("reason",))
        self.m_staleness = m.histogram(
            "paramserver_gradients_staleness", "Versions between the one a push was computed on and the newest"
            " when it was applied.", buckets=(0, 1, 2, 4, 8, 16, 32, 64))
        for reason in ("stale_gradients", "bad_gradients"):
            self.m_refused.labels(reason)  # exported at 0 from the start
        # gradient pushes (workers): applied by this shard's optimizer, checkpointed to ``checkpoint``
        self.gradients = GradientApplier(gradients or GradientsConfig(), checkpoint, shard, experiment)
        restored = self.gradients.load(num_shards)
        if restored is not None:
            self.layout, version, arrays = restored
            self.held = [Held(version, arrays, self.layout.fingerprint)]
            self.m_version.set(version)
            log.info("%s: version %d and its optimizer state restored from %s", self.name, version, checkpoint)
        for mtype, handler in (("publish", self.on_publish), ("get", self.on_get), ("wait", self.on_wait),
                               ("info", self.on_info), ("push_gradients", self.on_push_gradients)):
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

    def _is_retry(self, msg: Message) -> bool:
        """``msg`` publishes again exactly what this shard holds as its newest version."""
        newest = self.held[0]
        if (msg["version"] != newest.version or msg["layout"] != newest.layout
                or msg["num_shards"] != self.num_shards or msg.arrays.keys() != newest.arrays.keys()):
            return False
        return all(_same_bytes(a, newest.arrays[name]) for name, a in msg.arrays.items())

    def on_publish(self, peer: Peer, msg: Message) -> None:
        desc = msg.get("shm")
        if desc is None:
            self._store(peer, msg, None)
            return
        # The publisher shares this host's /dev/shm: the slice is in a file it wrote.
        if msg.arrays:
            raise RequestError("bad_shm", "a publish with shm names a file: it must carry no payload frames")
        if self.shm is None:
            self.reply_error(peer, "shm_unavailable", f"shard {self.shard} does not use shared memory; "
                             "publish with payload frames", count=False)
            return
        try:
            path, descriptors, msg.arrays = shmlib.map_published(desc)
        except shmlib.ShmUnavailable as exc:  # another host or container: an expected outcome
            self.reply_error(peer, "shm_unavailable", f"shard {self.shard}: {exc}; publish with payload frames",
                             count=False)
            return
        except ValueError as exc:
            raise RequestError("bad_shm", str(exc)) from None
        adopted = False
        try:
            adopted = self._store(peer, msg, (path, descriptors))
        finally:
            if not adopted:  # refused, or a retry of what this shard holds: the file is not needed
                shmlib.discard(path)

    def _store(self, peer: Peer, msg: Message, shm_file: tuple[str, list[list[Any]]] | None) -> bool:
        """Store a publish and wake the waits it satisfies; True if ``shm_file`` became the version's file."""
        version = msg["version"]
        if self.held and version == self.held[0].version and self._is_retry(msg):
            # The publisher retries after a timeout although this shard stored it: ack again.
            self.reply(peer, Message("publish_ack", {"version": version}))
            return False
        if self.held and version <= self.held[0].version:
            same = " with other contents or layout" if version == self.held[0].version else ""
            raise RequestError("stale_version", f"version {version} is not newer than version "
                               f"{self.held[0].version} held by shard {self.shard}{same}")
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
        adopted = shm_file is not None and self.shm is not None and self.shm.adopt(version, *shm_file)
        self.m_publishes.inc()
        self._keep(held)
        ack: dict[str, Any] = {"version": version}
        if self.shm is not None:
            if adopted:  # the publisher writes its next slice into a file no reader maps any more
                free = self.shm.take_free()
                if free is not None:
                    ack["free"] = [free]
        self.reply(peer, Message("publish_ack", ack))
        return adopted

    def _keep(self, held: Held) -> None:
        """Make ``held`` the newest version: drop the oldest, wake the long polls it satisfies."""
        self.held = [held, *self.held]
        dropped = [h.version for h in self.held[KEEP_VERSIONS:]]
        del self.held[KEEP_VERSIONS:]  # our own maps of those files go (and their locks with them)
        self.m_version.set(held.version)
        # Parked readers first, the sender's ack last: on a busy host the woken
        # sender (and what it does next) would otherwise compete with the sends.
        woken = [k for k, w in self.waits.items() if w.min_version <= held.version]
        for identity in woken:
            self._send_weights(self.waits[identity].peer, held, self.waits[identity].shm)
            del self.waits[identity]
        if woken:
            self._waits_changed()
        if self.shm is not None:
            for old in dropped:
                self.shm.drop(old)
            self._reclaim()

    def on_push_gradients(self, peer: Peer, msg: Message) -> None:
        # no registry touch: a push's sender is the worker's <actor id>/<token>, not its registry id
        other_layout = self.layout is not None and msg["layout"] != self.layout.fingerprint
        if msg["num_shards"] != self.num_shards or other_layout:
            self.m_refused.labels("layout_mismatch").inc()
            have = self.layout.fingerprint if self.layout else "none"
            raise RequestError("layout_mismatch", f"push is for layout {msg['layout']} over {msg['num_shards']}"
                               f" shards; shard {self.shard} holds layout {have} over {self.num_shards}")
        try:
            if self.layout is None:
                raise Refusal("no_weights", f"shard {self.shard} holds no weights yet: publish the initial"
                              " weights first, then push gradients computed on them")
            if msg.get("barrier") and (self.registry is None or self.num_shards > 1):
                raise Refusal("bad_field", "barrier pushes (synchronous gradient rounds) need a single paramserver"
                              f" shard, which counts the live workers; this paramserver has {self.num_shards}")
            ack, new = self.gradients.push(msg, self.layout, self.versions, self.held[0].arrays if self.held else None,
                                           peer)
        except Refusal as exc:
            self.m_refused.labels(exc.reason).inc()
            # a stale push is the expected cost of asynchrony, not a protocol error
            self.reply_error(peer, exc.reason, exc.detail, count=exc.reason != "stale_gradients")
            return
        if ack is None:  # held in the barrier round
            self._complete_round()
            return
        if new is not None:
            self.m_pushes.inc()
            self.m_staleness.observe(ack["staleness"])
            self._keep(Held(ack["version"], new, self.layout.fingerprint))
        self.reply(peer, Message("gradients_ack", ack))

    def _complete_round(self) -> None:
        """Barrier: once every live worker pushed for the round, apply their mean and answer them all."""
        if self.registry is None or self.layout is None or not self.gradients.round.pushes:
            return
        done = self.gradients.complete(self.registry.num_actors)
        if done is None:
            return
        acks, new = done
        self.m_pushes.inc(len(acks))
        for _ in acks:
            self.m_staleness.observe(0)
        self._keep(Held(acks[0][1]["version"], new, self.layout.fingerprint))
        for peer, body in acks:
            self.reply(peer, Message("gradients_ack", body))

    def _send_weights(self, peer: Peer, held: Held, shm: bool = False) -> None:
        body: dict[str, Any] = {"version": held.version, "versions": self.versions, "layout": held.layout}
        self.m_weights.inc()
        desc = self._export(held) if shm else None
        if desc is not None:
            body["shm"] = desc
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
            if held is None:  # expected while publishes overtake a reader: not a protocol error
                self.reply_error(peer, "version_gone", f"shard {self.shard} holds versions {self.versions}; "
                                 f"{exact} is not one of them", count=False)
                return
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
        old = self.waits.pop(peer.identity, None)
        if old is not None:  # the same DEALER asks again: its earlier poll is over
            self._send_not_modified(old.peer)
            self._waits_changed()
        if self.held and self.held[0].version >= want:
            self._send_weights(peer, self.held[0], bool(msg.get("shm")))
            return
        if len(self.waits) >= MAX_PARKED_WAITS:
            self.reply_error(peer, "busy", f"{MAX_PARKED_WAITS} long polls are already waiting on this shard",
                             count=False)
            return
        timeout_ms = min(max(msg["timeout_ms"], 0), MAX_WAIT_MS)
        self.waits[peer.identity] = ParkedWait(peer, want, time.monotonic() + timeout_ms / 1000, bool(msg.get("shm")))
        self._waits_changed()

    def _waits_changed(self) -> None:
        self.m_parked.set(len(self.waits))
        self._barriers_dirty = True

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

    # -- timers -------------------------------------------------------------
    def tick(self) -> None:
        now = time.monotonic()
        expired = [k for k, w in self.waits.items() if w.deadline <= now]
        for k in expired:
            self._send_not_modified(self.waits.pop(k).peer)
        if expired:
            self._waits_changed()
        self._tick_shm(now)
        self._complete_round()  # the registry may have expired a worker the round waited for
        if self.gradients.due(now) and self.layout is not None:
            self._checkpoint()
        if self.registry is None:
            return
        self._tick_coordination(now)

    def _checkpoint(self) -> None:
        assert self.layout is not None
        try:
            self.gradients.save(self.layout)
        except OSError as exc:  # a full disk: the shard goes on serving; the next tick tries again
            log.warning("%s: could not write its checkpoint %s: %s", self.name, self.gradients.path, exc)

    def close(self) -> None:
        if self.layout is not None:
            self._checkpoint()
        if self.shm is not None:
            self.shm.close()
        super().close()


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes (NaNs included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)))
