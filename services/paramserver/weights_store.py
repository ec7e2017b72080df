"""The models a shard holds, each its last two versions, and the checks a publish passes first.

A shard holds the default model (``DEFAULT_MODEL``, the policy the learner
publishes and the actors read: a publish, get or wait without ``model``) and
up to ``MAX_NAMED_MODELS`` named ones (a second model that a learner
publishes on its own key), each a :class:`Model`: its own layout (fixed by its
first publish), its own last two versions and its own stale-version checks.
Named models are served with payload frames only (their version numbers are
their own, and the shared-memory files are keyed by version), take no
gradient pushes and are not checkpointed: their publisher publishes them again
after a restart. A named model exists once a publish of it was stored; a read
of one that does not exist yet is answered as an empty shard answers.

No sockets here: :class:`~rlfleet.services.paramserver.weights_requests.WeightsRequests`
answers the requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import zmq

from rlfleet.common.tensor_shards import Layout
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.errors import RequestError
from rlfleet.common.wire.schema import DEFAULT_MODEL, model_name_problem

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
class Model:
    """One model of a shard: its layout (None before its first publish) and its newest versions."""

    name: str
    layout: Layout | None = None
    held: list[Held] = field(default_factory=list)  # newest first
    first: int | None = None  # the oldest version this shard has held of it (since it started)

    @property
    def versions(self) -> list[int]:
        return [h.version for h in self.held]

    @property
    def default(self) -> bool:
        return self.name == DEFAULT_MODEL


class WeightsStore:
    """The models of shard ``shard`` of ``num_shards``. Not thread-safe: the shard loop owns it."""

    def __init__(self, shard: int, num_shards: int) -> None:
        self.shard = shard
        self.num_shards = num_shards
        self.models: dict[str, Model] = {DEFAULT_MODEL: Model(DEFAULT_MODEL)}  # named ones once stored

    @property
    def default(self) -> Model:
        return self.models[DEFAULT_MODEL]

    @property
    def versions(self) -> list[int]:
        """The default model's versions, newest first."""
        return self.default.versions

    def model_of(self, msg: Message) -> Model:
        """The model ``msg`` names (an empty one, not kept, for a valid name not published yet)."""
        name = msg.get("model")
        if name is None:
            return self.default
        problem = model_name_problem(name)
        if problem is not None:
            raise RequestError("bad_field", f"{msg.type}.{problem}")
        model = self.models.get(name)
        return model if model is not None else Model(name)

    def is_retry(self, model: Model, msg: Message) -> bool:
        """``msg`` publishes again exactly what this shard holds as the model's newest version."""
        if not model.held:
            return False
        newest = model.held[0]
        if (msg["version"] != newest.version or msg["layout"] != newest.layout
                or msg["num_shards"] != self.num_shards or msg.arrays.keys() != newest.arrays.keys()):
            return False
        return all(same_bytes(a, newest.arrays[name]) for name, a in msg.arrays.items())

    def check_publish(self, model: Model, msg: Message) -> Layout:
        """The layout a publish of ``model`` is stored with; raises RequestError if it may not be."""
        version = msg["version"]
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
        return layout

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

    def keep(self, model: Model, held: Held, layout: Layout) -> list[int]:
        """Make ``held`` the model's newest version (storing the model if new); the versions dropped."""
        model.layout = layout
        if model.first is None:
            model.first = held.version
        self.models.setdefault(model.name, model)
        model.held = [held, *model.held]
        dropped = [h.version for h in model.held[KEEP_VERSIONS:]]
        del model.held[KEEP_VERSIONS:]  # our own maps of those files go (and their locks with them)
        return dropped


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes (NaNs included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)))


def received_frames(arrays: dict[str, np.ndarray]) -> bool:
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
