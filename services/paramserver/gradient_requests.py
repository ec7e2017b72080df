"""How a shard answers ``push_gradients``: its :class:`GradientApplier` checks and applies each
push (or holds it in the barrier's round), and what it makes becomes the default model's next
version, served like a published one. Also the applier's checkpoint: restored at start-up,
written every ``checkpoint_every_s`` and at close.

A stale push is the expected cost of asynchrony: refused and counted, not a protocol error.
"""

from __future__ import annotations

import logging

from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.errors import RequestError
from rlfleet.common.wire.server import Peer
from rlfleet.services.paramserver.gradient_rounds import actor_of
from rlfleet.services.paramserver.gradients import GradientApplier, Refusal
from rlfleet.services.paramserver.metrics import ShardMetrics
from rlfleet.services.paramserver.registry import Registry
from rlfleet.services.paramserver.replies import Replier
from rlfleet.services.paramserver.weights_requests import WeightsRequests
from rlfleet.services.paramserver.weights_store import Held, WeightsStore

log = logging.getLogger(__name__)


class GradientRequests:
    """The push_gradients handler of one shard; ``registry`` (shard 0 only) counts a barrier
    round's live workers."""

    def __init__(self, replier: Replier, applier: GradientApplier, store: WeightsStore, weights: WeightsRequests,
                 registry: Registry | None, metrics: ShardMetrics) -> None:
        self.replier = replier
        self.applier = applier
        self.store = store
        self.weights = weights  # keeps each new version and wakes its long polls
        self.registry = registry
        self.m = metrics

    def restore(self) -> None:
        """Serve the version the checkpoint holds, if there is one (raises ValueError if unreadable)."""
        restored = self.applier.load(self.store.num_shards)
        if restored is None:
            return
        layout, version, arrays = restored
        self.weights.keep(self.store.default, Held(version, arrays, layout.fingerprint), layout)
        log.info("%s: version %d and its optimizer state restored from %s", self.replier.name, version,
                 self.applier.path)

    def on_push_gradients(self, peer: Peer, msg: Message) -> None:
        # no registry touch: a push's sender is the worker's <actor id>/<token>, not its registry id
        policy = self.store.default  # pushes are for the default model only
        shard, num_shards = self.store.shard, self.store.num_shards
        other_layout = policy.layout is not None and msg["layout"] != policy.layout.fingerprint
        if msg["num_shards"] != num_shards or other_layout:
            self.m.refused.labels("layout_mismatch").inc()
            have = policy.layout.fingerprint if policy.layout else "none"
            raise RequestError("layout_mismatch", f"push is for layout {msg['layout']} over {msg['num_shards']}"
                               f" shards; shard {shard} holds layout {have} over {num_shards}")
        try:
            if policy.layout is None:
                raise Refusal("no_weights", f"shard {shard} holds no weights yet: publish the initial"
                              " weights first, then push gradients computed on them")
            if msg.get("barrier") and (self.registry is None or num_shards > 1):
                raise Refusal("bad_field", "barrier pushes (synchronous gradient rounds) need a single paramserver"
                              f" shard, which counts the live workers; this paramserver has {num_shards}")
            if msg.get("barrier") and not self._live_actor(actor_of(msg.sender)):
                raise Refusal("not_registered", f"a barrier push counts for the live actor its sender names"
                              f" (<actor id>/<token>); {actor_of(msg.sender)!r} is not one: say hello (or"
                              " heartbeat) first")
            ack, new = self.applier.push(msg, policy.layout, policy.versions,
                                         policy.held[0].arrays if policy.held else None, peer, policy.first)
        except Refusal as exc:
            self.m.refused.labels(exc.reason).inc()
            # a stale push is the expected cost of asynchrony, not a protocol error; busy says "not now"
            self.replier.reply_error(peer, exc.reason, exc.detail, count=exc.reason not in ("stale_gradients", "busy"))
            return
        if ack is None:  # held in the barrier round
            self.complete_round()
            return
        if new is not None:
            self.m.pushes.inc()
            self.m.staleness.observe(ack["staleness"])
            self.weights.keep(policy, Held(ack["version"], new, policy.layout.fingerprint), policy.layout)
        self.replier.reply(peer, Message("gradients_ack", ack))

    def complete_round(self) -> None:
        """Barrier: once every live worker pushed for the round, apply their mean and answer them all."""
        policy = self.store.default
        if self.registry is None or policy.layout is None or not self.applier.round.pushes:
            return
        live = {m.actor_id for m in self.registry.actors}
        for held in self.applier.round.gone(live):  # expired (or left) since it pushed: counts no more
            self.m.refused.labels("not_registered").inc()
            self.replier.reply_error(held.peer, "not_registered", f"{actor_of(held.sender)!r} left the registry"
                                     " before its round completed: heartbeat, then push for the next round")
        try:
            done = self.applier.complete(live)
        except Refusal as exc:  # the round's mean would have made the slice non-finite: every push refused
            for _, held in self.applier.round.take():
                self.m.refused.labels(exc.reason).inc()
                self.replier.reply_error(held.peer, exc.reason, exc.detail)
            return
        if done is None:
            return
        acks, new = done
        self.m.pushes.inc(len(acks))
        for _ in acks:
            self.m.staleness.observe(0)
        self.weights.keep(policy, Held(acks[0][1]["version"], new, policy.layout.fingerprint), policy.layout)
        for peer, body in acks:
            self.replier.reply(peer, Message("gradients_ack", body))

    def _live_actor(self, actor_id: str) -> bool:
        member = self.registry.get(actor_id) if self.registry is not None else None
        return member is not None and member.role == "actor"

    def tick(self, now: float) -> None:
        self.complete_round()  # the registry may have expired a worker the round waited for
        if self.applier.due(now):
            self.checkpoint()

    def checkpoint(self) -> None:
        """The default model only: a named model is published again by its publisher."""
        layout = self.store.default.layout
        if layout is None:
            return
        try:
            self.applier.save(layout)
        except OSError as exc:  # a full disk: the shard goes on serving; the next tick tries again
            log.warning("%s: could not write its checkpoint %s: %s", self.replier.name, self.applier.path, exc)

    def close(self) -> None:
        self.checkpoint()
