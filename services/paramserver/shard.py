"""One parameter-server shard: versioned weights, polls, long polls; on shard 0
also the actor registry and the round barrier (services/paramserver/coordination.py).

The shard keeps the last two versions of its slice, of the default model and
of each named one (services/paramserver/models.py, which also stores
publishes). Stored tensors are the read-only views of the frames the publish
arrived in (or of the publisher's shared-memory file, which the shard then
serves as that version's file): no copy on the way in. Replies send views of
received frames without a copy (that memory never changes; pyzmq holds it
until sent) and copy anything else into each message
(common.wire.transport.send_parts: a file's buffer is reused once its version
is dropped; arrays the shard computed from gradient pushes are its own).

Expected outcomes (a barrier's timeout, ``version_gone`` while publishes race
a reader, ``busy``) are not counted as protocol errors.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from common import weights_shm as shmlib
from common.config.sections import GradientsConfig
from common.metrics import ServiceMetrics
from common.wire.codec import Message
from common.wire.errors import RequestError
from common.wire.schema import DEFAULT_MODEL
from common.wire.server import Peer
from services.paramserver.coordination import MAX_WAIT_MS, CoordinatingServer, ParkedBarrier
from services.paramserver.gradients import GradientApplier, Refusal
from services.paramserver.models import Held, Model, ModelStore, ParkedWait
from services.paramserver.registry import Registry
from services.paramserver.shm_versions import ShmVersions

log = logging.getLogger(__name__)

MAX_PARKED_WAITS = 10_000


class ShardServer(ShmVersions, ModelStore, CoordinatingServer):
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
        self.models: dict[str, Model] = {DEFAULT_MODEL: Model(DEFAULT_MODEL)}  # named ones once published
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
            layout, version, arrays = restored
            self.default_model.layout = layout
            self.default_model.held = [Held(version, arrays, layout.fingerprint)]
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
        """The default model's versions, newest first."""
        return self.default_model.versions

    def on_push_gradients(self, peer: Peer, msg: Message) -> None:
        # no registry touch: a push's sender is the worker's <actor id>/<token>, not its registry id
        policy = self.default_model  # pushes are for the default model only
        other_layout = policy.layout is not None and msg["layout"] != policy.layout.fingerprint
        if msg["num_shards"] != self.num_shards or other_layout:
            self.m_refused.labels("layout_mismatch").inc()
            have = policy.layout.fingerprint if policy.layout else "none"
            raise RequestError("layout_mismatch", f"push is for layout {msg['layout']} over {msg['num_shards']}"
                               f" shards; shard {self.shard} holds layout {have} over {self.num_shards}")
        try:
            if policy.layout is None:
                raise Refusal("no_weights", f"shard {self.shard} holds no weights yet: publish the initial"
                              " weights first, then push gradients computed on them")
            if msg.get("barrier") and (self.registry is None or self.num_shards > 1):
                raise Refusal("bad_field", "barrier pushes (synchronous gradient rounds) need a single paramserver"
                              f" shard, which counts the live workers; this paramserver has {self.num_shards}")
            ack, new = self.gradients.push(msg, policy.layout, policy.versions,
                                           policy.held[0].arrays if policy.held else None, peer)
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
            self._keep(policy, Held(ack["version"], new, policy.layout.fingerprint))
        self.reply(peer, Message("gradients_ack", ack))

    def _complete_round(self) -> None:
        """Barrier: once every live worker pushed for the round, apply their mean and answer them all."""
        policy = self.default_model
        if self.registry is None or policy.layout is None or not self.gradients.round.pushes:
            return
        done = self.gradients.complete(self.registry.num_actors)
        if done is None:
            return
        acks, new = done
        self.m_pushes.inc(len(acks))
        for _ in acks:
            self.m_staleness.observe(0)
        self._keep(policy, Held(acks[0][1]["version"], new, policy.layout.fingerprint))
        for peer, body in acks:
            self.reply(peer, Message("gradients_ack", body))

    def _send_weights(self, peer: Peer, model: Model, held: Held, shm: bool = False) -> None:
        body: dict[str, Any] = {"version": held.version, "versions": model.versions, "layout": held.layout}
        self.m_weights.inc()
        desc = self._export(held) if shm and model.default else None  # named models: frames only
        if desc is not None:
            body["shm"] = desc
            self.reply(peer, Message("weights", body))
        else:  # views of received frames go without a copy (Held.frames); anything else is copied
            self.reply(peer, Message("weights", body, held.arrays), copy=not held.frames)

    def _send_not_modified(self, peer: Peer, model: str = DEFAULT_MODEL) -> None:
        self.m_not_modified.inc()
        m = self.models.get(model)  # none: a named model not published yet
        self.reply(peer, Message("not_modified", {"versions": m.versions if m is not None else []}))

    def _touch(self, msg: Message) -> None:
        if self.registry is not None and msg.sender:
            self.registry.touch(msg.sender)

    def on_get(self, peer: Peer, msg: Message) -> None:
        model = self._model(msg)
        self._touch(msg)
        self.m_gets.inc()
        have = msg["have_version"]
        exact = msg.get("version")
        if exact is not None:
            held = next((h for h in model.held if h.version == exact), None)
            if held is None:  # expected while publishes overtake a reader: not a protocol error
                self.reply_error(peer, "version_gone", f"shard {self.shard} holds versions {model.versions} of "
                                 f"model {model.name!r}; {exact} is not one of them", count=False)
                return
        else:
            held = model.held[0] if model.held else None
        if held is None or held.version <= have:
            self._send_not_modified(peer, model.name)
        else:
            self._send_weights(peer, model, held, bool(msg.get("shm")))

    def on_wait(self, peer: Peer, msg: Message) -> None:
        model = self._model(msg)
        self._touch(msg)
        self.m_waits.inc()
        have = msg.get("have_version")
        want = max(msg["min_version"], -1 if have is None else have + 1)
        old = self.waits.pop(peer.identity, None)
        if old is not None:  # the same DEALER asks again: its earlier poll is over
            self._send_not_modified(old.peer, old.model)
            self._waits_changed()
        if model.held and model.held[0].version >= want:
            self._send_weights(peer, model, model.held[0], bool(msg.get("shm")))
            return
        if len(self.waits) >= MAX_PARKED_WAITS:
            self.reply_error(peer, "busy", f"{MAX_PARKED_WAITS} long polls are already waiting on this shard",
                             count=False)
            return
        timeout_ms = min(max(msg["timeout_ms"], 0), MAX_WAIT_MS)
        self.waits[peer.identity] = ParkedWait(peer, want, time.monotonic() + timeout_ms / 1000, bool(msg.get("shm")),
                                               model.name)
        self._waits_changed()

    def _waits_changed(self) -> None:
        self.m_parked.set(len(self.waits))
        self._barriers_dirty = True

    def on_info(self, peer: Peer, msg: Message) -> None:
        policy = self.default_model
        stats: dict[str, Any] = {
            "versions": policy.versions,
            "layout": policy.layout.fingerprint if policy.layout else "",
            "num_shards": self.num_shards,
            "waits_parked": len(self.waits),
            "shm": self.shm is not None,
            "models": {name: m.versions for name, m in self.models.items()},
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
            wait = self.waits.pop(k)
            self._send_not_modified(wait.peer, wait.model)
        if expired:
            self._waits_changed()
        self._tick_shm(now)
        self._complete_round()  # the registry may have expired a worker the round waited for
        if self.gradients.due(now) and self.default_model.layout is not None:
            self._checkpoint()
        if self.registry is None:
            return
        self._tick_coordination(now)

    def _checkpoint(self) -> None:
        """The default model only: a named model is published again by its publisher."""
        layout = self.default_model.layout
        assert layout is not None
        try:
            self.gradients.save(layout)
        except OSError as exc:  # a full disk: the shard goes on serving; the next tick tries again
            log.warning("%s: could not write its checkpoint %s: %s", self.name, self.gradients.path, exc)

    def close(self) -> None:
        if self.default_model.layout is not None:
            self._checkpoint()
        if self.shm is not None:
            self.shm.close()
        super().close()

