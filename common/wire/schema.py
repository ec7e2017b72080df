"""Every message type on the wire, with its body fields and arrays.

This table is what the decoder checks a body against, and what
tests/unit/wire/test_protocol_doc.py compares with docs/protocol.md: a type or field
that is here must be documented there. Unknown body fields are ignored by the
decoder (forward compatibility); missing required ones are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_KINDS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (float, int),
    "str": (str,),
    "bool": (bool,),
    "map": (dict,),
    "list": (list,),
}


@dataclass(frozen=True)
class FieldSpec:
    kind: str
    required: bool = True
    doc: str = ""
    bounds: tuple[int, int] | None = None  # ints: allowed [low, high], checked (bad_field) on receipt

    def __post_init__(self) -> None:
        # every int on the wire has a documented range, checked before any handler does arithmetic on it
        if (self.kind == "int") != (self.bounds is not None):
            raise ValueError(f"an int field needs bounds and only an int field takes them: {self}")

    def accepts(self, value: Any) -> bool:
        if self.kind != "bool" and isinstance(value, bool):
            return False
        if not self.required and value is None:
            return True
        return isinstance(value, _KINDS[self.kind])

    def describe(self) -> str:
        return self.kind if self.required else f"{self.kind} or nil"


@dataclass(frozen=True)
class ArraySpec:
    dtypes: tuple[str, ...] = ()  # empty: any allowed dtype
    ndim: int | None = None
    required: bool = True
    doc: str = ""


@dataclass(frozen=True)
class MessageSpec:
    name: str
    doc: str
    fields: dict[str, FieldSpec] = field(default_factory=dict)
    arrays: dict[str, ArraySpec] = field(default_factory=dict)
    open_arrays: bool = False  # True: arrays beyond those listed are data columns / tensors
    needs_sender: bool = False  # True: (sender, seq) names the message (exactly-once), so sender is not ""


def _f(kind: str, doc: str, required: bool = True, bounds: tuple[int, int] | None = None) -> FieldSpec:
    return FieldSpec(kind, required, doc, bounds)


def _int(doc: str, bounds: tuple[int, int], required: bool = True) -> FieldSpec:
    return FieldSpec("int", required, doc, bounds)


INT64_MAX = (1 << 63) - 1
SEQ_RANGE = (0, (1 << 64) - 1)
REF_SEQ_RANGE = (-1, (1 << 64) - 1)  # an error's: -1 when the request had no readable seq
TIMEOUT_RANGE = (0, INT64_MAX)  # never negative; servers cap long ones (10 minutes)
VERSION_RANGE = (-1, INT64_MAX)  # -1: none
PUBLISHED_RANGE = (0, INT64_MAX)  # a version that was (or is being) published
COUNT_RANGE = (0, INT64_MAX)  # counts, sizes and totals; a server saturates a total at the top
SHARD_RANGE = (0, (1 << 31) - 1)  # a shard index
NUM_SHARDS_RANGE = (1, 1 << 31)
INDEX_RANGE = (-1, (1 << 31) - 1)  # an actor's index in the registry, -1 for none
SAMPLE_BATCH_RANGE = (1, 1 << 16)  # items in one sample


def range_text(bounds: tuple[int, int]) -> str:
    """``bounds`` as docs/protocol.md writes a range: ``0 to 2^64-1``, ``1 to 65536``."""
    return f"{_bound_text(bounds[0])} to {_bound_text(bounds[1])}"


def _bound_text(n: int) -> str:
    for k in (31, 63, 64):
        if n == (1 << k) - 1:
            return f"2^{k}-1"
        if n == 1 << k:
            return f"2^{k}"
    return str(n)

DEFAULT_MODEL = "policy"  # the paramserver's model of a publish, get or wait without ``model``
MODEL_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")  # what ``model`` may be


def model_name_problem(name: Any) -> str | None:
    """What is wrong with ``name`` as a paramserver ``model`` (None: nothing)."""
    if isinstance(name, str) and MODEL_NAME.fullmatch(name):
        return None
    return (f"model {name!r} is not a model name; allowed: a lowercase letter then up to 31 lowercase letters,"
            f" digits or '_' ({MODEL_NAME.pattern}); none means the default model {DEFAULT_MODEL!r}")


_KEY = ArraySpec(("uint64",), 1, True, "item keys")

_SPECS = [
    # -- common -----------------------------------------------------------
    MessageSpec("error", "Reply to a request that failed or could not be decoded.", {
        "ref_seq": _int("seq of the request, also when the rest could not be decoded; -1 only without a"
                        " readable seq", REF_SEQ_RANGE),
        "reason": _f("str", "machine-readable reason"),
        "detail": _f("str", "human-readable explanation"),
    }),
    MessageSpec("info", "Ask a server to describe itself.", {}),
    MessageSpec("info_reply", "A server's description and counters.", {
        "ref_seq": _int("seq of the info request", SEQ_RANGE),
        "service": _f("str", "replay | paramserver"),
        "shard": _int("shard index of this server", SHARD_RANGE),
        "stats": _f("map", "service-specific figures"),
    }),
    # -- replay -----------------------------------------------------------
    MessageSpec("insert", "Store a batch of N transitions; (sender, seq) makes it exactly-once.", {
        "table": _f("str", "table name"),
        "window_start": _int("lowest seq the sender has not seen acked; older seqs are never resent", SEQ_RANGE,
                             False),
        "merge_acks": _f("bool", "true: this insert may be acked together with others of the sender (ack.more)",
                         False),
    }, {
        "priority": ArraySpec(("float32", "float64"), 1, False, "initial priorities, shape [N]"),
    }, open_arrays=True, needs_sender=True),
    MessageSpec("ack", "An insert is stored (or was a duplicate of a stored one).", {
        "ref_seq": _int("seq of the insert", SEQ_RANGE),
        "stored": _int("transitions stored by this insert (0 for a duplicate)", COUNT_RANGE),
        "duplicate": _f("bool", "true when (sender, seq) was already stored"),
        "more": _f("list", "further inserts of the same sender this ack answers: [seq, stored, duplicate] each",
                   False),
    }),
    MessageSpec("sample", "Ask for a batch; held while the rate limiter says wait.", {
        "table": _f("str", "table name"),
        "batch_size": _int("number of items", SAMPLE_BATCH_RANGE),
        "timeout_ms": _int("give up after this long; error reason 'timeout'", TIMEOUT_RANGE, False),
        "rate_limited": _f("bool", "false: served once the table holds min_size items, and not counted by the"
                           " rate limiter (a second consumer); default true", False),
    }),
    MessageSpec("batch", "The reply to sample: data columns plus key and probability.", {
        "ref_seq": _int("seq of the sample request", SEQ_RANGE),
        "table": _f("str", "table name"),
        "shard": _int("shard that served it", SHARD_RANGE),
        "table_size": _int("items in the table when sampled", COUNT_RANGE),
    }, {
        "key": _KEY,
        "probability": ArraySpec(("float64",), 1, True, "sampling probability of each item"),
    }, open_arrays=True),
    MessageSpec("priorities", "Set new priorities for sampled keys.", {
        "table": _f("str", "table name"),
    }, {
        "key": _KEY,
        "priority": ArraySpec(("float32", "float64"), 1, True, "new priority per key"),
    }),
    MessageSpec("priorities_ack", "Priorities applied.", {
        "ref_seq": _int("seq of the priorities message", SEQ_RANGE),
        "updated": _int("keys still present and updated", COUNT_RANGE),
    }),
    # -- paramserver ------------------------------------------------------
    MessageSpec("publish", "The learner's slice of one weights version for this shard.", {
        "version": _int("weights version, increasing", PUBLISHED_RANGE),
        "num_shards": _int("shards the model is split across", NUM_SHARDS_RANGE),
        "layout": _f("str", "fingerprint of the partition (names, shapes, dtypes)"),
        "tensors": _f("list", "whole model as [name, dtype, shape] sorted by name; needed on a shard's"
                      " first publish, lets it check its slice", False),
        "shm": _f("map", "instead of payload frames, a file the publisher wrote on the shard's host:"
                  " {path, arrays: [[name, dtype, shape, offset]]}", False),
        "model": _f("str", "a named model of the shard, e.g. a world model (payload frames only, not checkpointed);"
                    " none: the default model", False),
    }, open_arrays=True),
    MessageSpec("publish_ack", "A version is stored on this shard.", {
        "ref_seq": _int("seq of the publish", SEQ_RANGE),
        "version": _int("version stored", PUBLISHED_RANGE),
        "free": _f("list", "files of dropped versions no reader maps, for the publisher's next shm slice", False),
    }),
    MessageSpec("push_gradients", "A worker's gradients for this shard's slice, computed on one version;"
                " applied once per (sender, seq).", {
        "version": _int("weights version the gradients were computed on", PUBLISHED_RANGE),
        "num_shards": _int("shards the model is split across", NUM_SHARDS_RANGE),
        "layout": _f("str", "fingerprint of the partition the weights came with"),
        "window_start": _int("lowest seq the sender has not seen answered; older pushes are never resent",
                             SEQ_RANGE, False),
        "barrier": _f("bool", "true: part of a synchronous round, answered once every live worker pushed", False),
    }, open_arrays=True, needs_sender=True),
    MessageSpec("gradients_ack", "A push is applied (or was a duplicate of an applied one).", {
        "ref_seq": _int("seq of the push", SEQ_RANGE),
        "version": _int("this shard's newest version after the push", VERSION_RANGE),
        "applied": _f("bool", "true when this push made that version"),
        "duplicate": _f("bool", "true when (sender, seq) was applied before (nothing applied now)"),
        "staleness": _int("versions between the push's version and the newest when applied", COUNT_RANGE),
    }),
    MessageSpec("get", "Poll for weights.", {
        "have_version": _int("version the reader holds (-1: none)", VERSION_RANGE),
        "version": _int("exact version wanted (one of the two kept)", PUBLISHED_RANGE, False),
        "shm": _f("bool", "the reader can map this host's /dev/shm: answer with weights.shm", False),
        "model": _f("str", "a named model of the shard, e.g. a world model (payload frames only, not checkpointed);"
                    " none: the default model", False),
    }),
    MessageSpec("wait", "Long poll: answer when a version >= min_version is held, or at timeout.", {
        "min_version": _int("lowest acceptable version", VERSION_RANGE),
        "timeout_ms": _int("answer not_modified after this long", TIMEOUT_RANGE),
        "have_version": _int("version the reader holds (-1: none)", VERSION_RANGE, False),
        "shm": _f("bool", "the reader can map this host's /dev/shm: answer with weights.shm", False),
        "model": _f("str", "a named model of the shard, e.g. a world model (payload frames only, not checkpointed);"
                    " none: the default model", False),
    }),
    MessageSpec("weights", "One shard's tensors of one version.", {
        "ref_seq": _int("seq of the get or wait", SEQ_RANGE),
        "version": _int("version of these tensors", PUBLISHED_RANGE),
        "versions": _f("list", "versions this shard holds, newest first"),
        "layout": _f("str", "fingerprint of the partition"),
        "shm": _f("map", "instead of payload frames: {path, probe, arrays: [[name, dtype, shape, offset]]}",
                  False),
    }, open_arrays=True),
    MessageSpec("not_modified", "Nothing newer than asked for.", {
        "ref_seq": _int("seq of the get or wait", SEQ_RANGE),
        "versions": _f("list", "versions this shard holds, newest first"),
    }),
    MessageSpec("hello", "An actor joins the registry (shard 0).", {
        "actor_id": _f("str", "stable id of the actor"),
        "role": _f("str", "actor | evaluator"),
    }),
    MessageSpec("welcome", "Registry answer to hello, heartbeat or goodbye.", {
        "ref_seq": _int("seq of the hello, heartbeat or goodbye", SEQ_RANGE),
        "index": _int("0..N-1, stable while the actor lives (-1 for evaluators and after goodbye)", INDEX_RANGE),
        "num_actors": _int("live actors", COUNT_RANGE),
        "liveness_ms": _int("an actor silent this long leaves the registry", COUNT_RANGE),
        "fleet_env_steps": _int("env steps all actors reported, restarts included", COUNT_RANGE, False),
    }),
    MessageSpec("heartbeat", "An actor is alive; re-registers it if it had expired.", {
        "actor_id": _f("str", "stable id of the actor"),
        "role": _f("str", "actor | evaluator"),
        "version": _int("weights version the actor holds", VERSION_RANGE),
        "env_steps": _int("env steps this actor took since it started", COUNT_RANGE, False),
    }),
    MessageSpec("goodbye", "An actor leaves the registry on a clean stop.", {
        "actor_id": _f("str", "stable id of the actor"),
    }),
    MessageSpec("barrier", "The learner waits until every live actor waits for round + 1.", {
        "round": _int("round k: actors have finished acting on version k", PUBLISHED_RANGE),
        "timeout_ms": _int("answer with error reason 'timeout' after this long", TIMEOUT_RANGE),
    }),
    MessageSpec("barrier_reply", "Every live actor is waiting for version round + 1.", {
        "ref_seq": _int("seq of the barrier request", SEQ_RANGE),
        "round": _int("the round", PUBLISHED_RANGE),
        "actors": _int("actors that reached the barrier", COUNT_RANGE),
    }),
]

MESSAGES: dict[str, MessageSpec] = {spec.name: spec for spec in _SPECS}
