"""The models a shard holds, and how a publish stores a version of one: a mixin of
:class:`~services.paramserver.shard.ShardServer`.

A shard holds the default model (``DEFAULT_MODEL``, the policy the learner
publishes and the actors read: a publish, get or wait without ``model``) and
up to ``MAX_NAMED_MODELS`` named ones (a second model such as the world model
of a model-based learner), each a :class:`Model`: its own layout (fixed by its
first publish), its own last two versions and its own stale-version checks;
a long poll waits for a version of its model only. Named models are served
with payload frames only (their version numbers are their own, and the
shared-memory files are keyed by version), take no gradient pushes and are
not checkpointed: their publisher publishes them again after a restart. A
named model exists once a publish of it was stored; a read of one that does
not exist yet is answered as an empty shard answers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from common import weights_shm as shmlib
from common.tensor_shards import Layout
from common.wire.codec import Message
from common.wire.errors import RequestError
from common.wire.schema import DEFAULT_MODEL, model_name_problem
from common.wire.server import Peer, Server

log = logging.getLogger("services.paramserver.shard")

KEEP_VERSIONS = 2
MAX_NAMED_MODELS = 8  # per shard, besides the default model


@dataclass
class Held:
    version: int
    arrays: dict[str, np.ndarray]
    layout: str
    #: the arrays are read-only views of the frames a publish arrived in: memory that is never
    #: written to or reused, so replies may send it without a copy (not so a shared-memory
    #: file's views, whose file is reused once the version is dropped, nor arrays the shard
    #: computed or restored itself)
    frames: bool = False


@dataclass
class ParkedWait:
    peer: Peer
    min_version: int
    deadline: float
    shm: bool
    model: str = DEFAULT_MODEL


@dataclass
class Model:
    """One model of a shard: its layout (None before its first publish) and its newest versions."""

    name: str
    layout: Layout | None = None
    held: list[Held] = field(default_factory=list)  # newest first

    @property
    def versions(self) -> list[int]:
        return [h.version for h in self.held]

    @property
    def default(self) -> bool:
        return self.name == DEFAULT_MODEL


class ModelStore(Server):
    """The models of a shard, and the ``publish`` handler. ``models`` is set up by the shard."""

    shard: int
    num_shards: int
    models: dict[str, Model]  # the default model always; named ones once published
    waits: dict[bytes, ParkedWait]
    shm: shmlib.ShmExporter | None
    m_publishes: Any
    m_version: Any

    @property
    def default_model(self) -> Model:
        return self.models[DEFAULT_MODEL]

    def _model(self, msg: Message) -> Model:
        """The model ``msg`` names (an empty one, not kept, for a valid name not published yet)."""
        name = msg.get("model")
        if name is None:
            return self.default_model
        problem = model_name_problem(name)
        if problem is not None:
            raise RequestError("bad_field", f"{msg.type}.{problem}")
        model = self.models.get(name)
        return model if model is not None else Model(name)

    def _layout_of(self, model: Model, msg: Message) -> Layout:
        fp = msg["layout"]
        if msg["num_shards"] != self.num_shards:
            raise RequestError("layout_mismatch", f"publish is split across {msg['num_shards']} shards; "
                               f"this paramserver has {self.num_shards}")
        if model.layout is not None:
            if fp != model.layout.fingerprint:
                what = "a new model needs a fresh paramserver" if model.default else "a model keeps its first layout"
                raise RequestError("layout_mismatch", f"publish of model {model.name!r} has layout {fp}; this shard "
                                   f"holds layout {model.layout.fingerprint} for it ({what})")
            return model.layout
        try:
            layout = Layout.from_wire(msg.get("tensors") or [], self.num_shards)
        except ValueError as exc:
            raise RequestError("layout_mismatch", f"publish.tensors: {exc}") from None
        if layout.fingerprint != fp:
            raise RequestError("layout_mismatch", f"publish.layout {fp} is not the fingerprint of "
                               f"publish.tensors ({layout.fingerprint})")
        return layout

    def _is_retry(self, model: Model, msg: Message) -> bool:
        """``msg`` publishes again exactly what this shard holds as the model's newest version."""
        newest = model.held[0]
        if (msg["version"] != newest.version or msg["layout"] != newest.layout
                or msg["num_shards"] != self.num_shards or msg.arrays.keys() != newest.arrays.keys()):
            return False
        return all(_same_bytes(a, newest.arrays[name]) for name, a in msg.arrays.items())

    def on_publish(self, peer: Peer, msg: Message) -> None:
        model = self._model(msg)
        desc = msg.get("shm")
        if desc is None:
            self._store(peer, msg, model, None)
            return
        # The publisher shares this host's /dev/shm: the slice is in a file it wrote.
        if msg.arrays:
            raise RequestError("bad_shm", "a publish with shm names a file: it must carry no payload frames")
        if self.shm is None or not model.default:
            why = "does not use shared memory" if model.default else f"serves model {model.name!r} with frames only"
            self.reply_error(peer, "shm_unavailable", f"shard {self.shard} {why}; publish with payload frames",
                             count=False)
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
            adopted = self._store(peer, msg, model, (path, descriptors))
        finally:
            if not adopted:  # refused, or a retry of what this shard holds: the file is not needed
                shmlib.discard(path)

    def _store(self, peer: Peer, msg: Message, model: Model, shm_file: tuple[str, list[list[Any]]] | None) -> bool:
        """Store a publish and wake the waits it satisfies; True if ``shm_file`` became the version's file."""
        version = msg["version"]
        if model.held and version == model.held[0].version and self._is_retry(model, msg):
            # The publisher retries after a timeout although this shard stored it: ack again.
            self.reply(peer, Message("publish_ack", {"version": version}))
            return False
        if model.held and version <= model.held[0].version:
            same = " with other contents or layout" if version == model.held[0].version else ""
            raise RequestError("stale_version", f"version {version} of model {model.name!r} is not newer than "
                               f"version {model.held[0].version} held by shard {self.shard}{same}")
        if version < 0:
            raise RequestError("stale_version", f"version {version} is negative")
        if model.name not in self.models and len(self.models) > MAX_NAMED_MODELS:
            named = sorted(n for n in self.models if n != DEFAULT_MODEL)
            raise RequestError("bad_field", f"publish.model {model.name!r}: shard {self.shard} already holds "
                               f"{len(named)} named models {named}; allowed: at most {MAX_NAMED_MODELS} besides "
                               f"the default model {DEFAULT_MODEL!r}")
        layout = self._layout_of(model, msg)
        problem = layout.check_shard(self.shard, msg.arrays)
        if problem:
            raise RequestError("layout_mismatch", problem)
        if model.layout is None:
            log.info("%s: model %r: layout %s, %d tensors on this shard (%d bytes)", self.name, model.name,
                     layout.fingerprint, len(layout.shards[self.shard]), layout.shard_nbytes(self.shard))
        model.layout = layout
        self.models.setdefault(model.name, model)
        held = Held(version, dict(msg.arrays), layout.fingerprint, frames=shm_file is None and _received(msg.arrays))
        adopted = shm_file is not None and self.shm is not None and self.shm.adopt(version, *shm_file)
        self.m_publishes.inc()
        self._keep(model, held)
        ack: dict[str, Any] = {"version": version}
        if self.shm is not None:
            if adopted:  # the publisher writes its next slice into a file no reader maps any more
                free = self.shm.take_free()
                if free is not None:
                    ack["free"] = [free]
        self.reply(peer, Message("publish_ack", ack))
        return adopted

    def _keep(self, model: Model, held: Held) -> None:
        """Make ``held`` the model's newest version: drop its oldest, wake the long polls it satisfies."""
        model.held = [held, *model.held]
        dropped = [h.version for h in model.held[KEEP_VERSIONS:]]
        del model.held[KEEP_VERSIONS:]  # our own maps of those files go (and their locks with them)
        if model.default:
            self.m_version.set(held.version)
        # Parked readers first, the sender's ack last: on a busy host the woken
        # sender (and what it does next) would otherwise compete with the sends.
        woken = [k for k, w in self.waits.items() if w.model == model.name and w.min_version <= held.version]
        for identity in woken:
            self._send_weights(self.waits[identity].peer, model, held, self.waits[identity].shm)
            del self.waits[identity]
        if woken:
            self._waits_changed()
        if self.shm is not None and model.default:
            for old in dropped:
                self.shm.drop(old)
            self._reclaim()

    if TYPE_CHECKING:  # provided by the shard (and its shared-memory mixin)
        def _send_weights(self, peer: Peer, model: Model, held: Held, shm: bool = False) -> None: ...

        def _waits_changed(self) -> None: ...

        def _reclaim(self) -> None: ...


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes (NaNs included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)))


def _received(arrays: dict[str, np.ndarray]) -> bool:
    """Every array is a view of a received ZeroMQ frame (a publish decoded from the wire)."""
    for a in arrays.values():
        base = a
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        if isinstance(base, memoryview):
            base = base.obj
        if not isinstance(base, zmq.Frame):
            return False
    return True
