"""How a shard answers ``publish``, ``get`` and ``wait``: it stores versions in its
:class:`WeightsStore`, answers readers at once or parks them in its :class:`LongPolls`, and serves
same-host readers of the default model from its :class:`ShmVersions`.

Stored tensors are the read-only views of the frames the publish arrived in (or
of the publisher's shared-memory file, which the shard then serves as that
version's file): no copy on the way in. Replies send views of received frames
without a copy (that memory never changes; pyzmq holds it until sent) and copy
anything else into each message (common.wire.transport.send_parts: a file's
buffer is reused once its version is dropped; arrays the shard computed from
gradient pushes are its own).

``version_gone`` while publishes race a reader and ``busy`` are expected
outcomes, not counted as protocol errors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from rlfleet.common import weights_shm as shmlib
from rlfleet.common.tensor_shards import Layout
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.errors import RequestError
from rlfleet.common.wire.schema import DEFAULT_MODEL
from rlfleet.common.wire.server import Peer
from rlfleet.services.paramserver.long_polls import MAX_PARKED_WAITS, LongPolls
from rlfleet.services.paramserver.metrics import ShardMetrics
from rlfleet.services.paramserver.registry import Registry
from rlfleet.services.paramserver.replies import Replier
from rlfleet.services.paramserver.shm_versions import ShmVersions
from rlfleet.services.paramserver.weights_store import Held, Model, WeightsStore, received_frames

log = logging.getLogger(__name__)


@dataclass
class WeightsRequests:
    """The publish / get / wait handlers of one shard: no state of its own, only the parts it is handed.
    ``registry`` (shard 0 only) is told of the signs of life that gets and waits are."""

    replier: Replier
    store: WeightsStore
    long_polls: LongPolls
    shm: ShmVersions
    registry: Registry | None
    m: ShardMetrics

    # -- publish ------------------------------------------------------------
    def on_publish(self, peer: Peer, msg: Message) -> None:
        model = self.store.model_of(msg)
        desc = msg.get("shm")
        if desc is None:
            self._store(peer, msg, model, None)
            return
        # The publisher shares this host's /dev/shm: the slice is in a file it wrote.
        if msg.arrays:
            raise RequestError("bad_shm", "a publish with shm names a file: it must carry no payload frames")
        shard = self.store.shard
        if not self.shm.enabled or not model.default:
            why = "does not use shared memory" if model.default else f"serves model {model.name!r} with frames only"
            self.replier.reply_error(peer, "shm_unavailable", f"shard {shard} {why}; publish with payload frames",
                                     count=False)
            return
        try:
            path, descriptors, msg.arrays = shmlib.map_published(desc)
        except shmlib.ShmUnavailable as exc:  # another host or container: an expected outcome
            self.replier.reply_error(peer, "shm_unavailable", f"shard {shard}: {exc}; publish with payload frames",
                                     count=False)
            return
        except ValueError as exc:
            raise RequestError("bad_shm", str(exc)) from None
        adopted = False
        try:
            adopted = self._store(peer, msg, model, (path, descriptors))
        finally:
            if not adopted:  # refused, or a retry of what this shard holds: the file is not needed
                shmlib.discard(path)

    def _store(self, peer: Peer, msg: Message, model: Model, shm_file: tuple[str, list[list[Any]]] | None) -> bool:
        """Store a publish and wake the waits it satisfies; True if ``shm_file`` became the version's file."""
        version = msg["version"]
        if self.store.is_retry(model, msg):
            # The publisher retries after a timeout although this shard stored it: ack again.
            self.replier.reply(peer, Message("publish_ack", {"version": version}))
            return False
        layout = self.store.check_publish(model, msg)
        if model.layout is None:
            shard = self.store.shard
            log.info("%s: model %r: layout %s, %d tensors on this shard (%d bytes)", self.replier.name, model.name,
                     layout.fingerprint, len(layout.shards[shard]), layout.shard_nbytes(shard))
        held = Held(version, dict(msg.arrays), layout.fingerprint,
                    frames=shm_file is None and received_frames(msg.arrays))
        adopted = shm_file is not None and self.shm.adopt(version, *shm_file)
        self.m.publishes.inc()
        self.keep(model, held, layout)
        ack: dict[str, Any] = {"version": version}
        if adopted:  # the publisher writes its next slice into a file no reader maps any more
            free = self.shm.take_free()
            if free is not None:
                ack["free"] = [free]
        self.replier.reply(peer, Message("publish_ack", ack))
        return adopted

    def keep(self, model: Model, held: Held, layout: Layout) -> None:
        """Make ``held`` (of ``layout``) the model's newest version and wake the long polls it satisfies."""
        dropped = self.store.keep(model, held, layout)
        if model.default:
            self.m.version.set(held.version)
        # Parked readers first, the sender's ack last: on a busy host the woken
        # sender (and what it does next) would otherwise compete with the sends.
        for wait in self.long_polls.woken_by(model.name, held.version):
            self.send_weights(wait.peer, model, held, wait.shm)
        if model.default:
            self.shm.retire(dropped)

    # -- get and wait -------------------------------------------------------
    def on_get(self, peer: Peer, msg: Message) -> None:
        model = self.store.model_of(msg)
        self._touch(msg)
        self.m.gets.inc()
        have = msg["have_version"]
        exact = msg.get("version")
        if exact is not None:
            held = next((h for h in model.held if h.version == exact), None)
            if held is None:  # expected while publishes overtake a reader: not a protocol error
                self.replier.reply_error(peer, "version_gone", f"shard {self.store.shard} holds versions "
                                         f"{model.versions} of model {model.name!r}; {exact} is not one of them",
                                         count=False)
                return
        else:
            held = model.held[0] if model.held else None
        if held is None or held.version <= have:
            self.send_not_modified(peer, model.name)
        else:
            self.send_weights(peer, model, held, bool(msg.get("shm")))

    def on_wait(self, peer: Peer, msg: Message) -> None:
        model = self.store.model_of(msg)
        self._touch(msg)
        self.m.waits.inc()
        have = msg.get("have_version")
        want = max(msg["min_version"], -1 if have is None else have + 1)
        old = self.long_polls.end(peer.identity)
        if old is not None:  # the same DEALER asks again: its earlier poll is over
            self.send_not_modified(old.peer, old.model)
        if model.held and model.held[0].version >= want:
            self.send_weights(peer, model, model.held[0], bool(msg.get("shm")))
            return
        if self.long_polls.full:
            self.replier.reply_error(peer, "busy", f"{MAX_PARKED_WAITS} long polls are already waiting on this"
                                     " shard", count=False)
            return
        self.long_polls.park(peer, want, msg["timeout_ms"], bool(msg.get("shm")), model.name)

    def tick(self, now: float) -> None:
        """Answer the long polls whose deadline passed."""
        for wait in self.long_polls.expired(now):
            self.send_not_modified(wait.peer, wait.model)

    def _touch(self, msg: Message) -> None:
        if self.registry is not None and msg.sender:
            self.registry.touch(msg.sender)

    # -- replies ------------------------------------------------------------
    def send_weights(self, peer: Peer, model: Model, held: Held, shm: bool = False) -> None:
        body: dict[str, Any] = {"version": held.version, "versions": model.versions, "layout": held.layout}
        self.m.weights_served.inc()
        desc = self.shm.export(held) if shm and model.default else None  # named models: frames only
        if desc is not None:
            body["shm"] = desc
            self.replier.reply(peer, Message("weights", body))
        else:  # views of received frames go without a copy (Held.frames); anything else is copied
            self.replier.reply(peer, Message("weights", body, held.arrays), copy=not held.frames)

    def send_not_modified(self, peer: Peer, model: str = DEFAULT_MODEL) -> None:
        self.m.not_modified.inc()
        m = self.store.models.get(model)  # none: a named model not published yet
        self.replier.reply(peer, Message("not_modified", {"versions": m.versions if m is not None else []}))
