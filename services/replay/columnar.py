"""Columnar, preallocated ring storage: what every replay table kind shares.

Every table stores items in a ring of ``capacity`` slots, one numpy array
per column, allocated when the first insert fixes the schema (column names,
dtypes, per-item shapes). Keys are uint64, unique and increasing per table:
the item with key ``k`` lives in slot ``k % capacity`` and is present while
``next_key - size <= k < next_key``, so no key index is needed.

:class:`Table` holds the ring, checks batches against the schema, inserts
(also straight from a packed payload), samples by the keys its kind selects
(``_select``, in :mod:`rlfleet.services.replay.tables`), and copies itself for
snapshots.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet.common.algorithms.values import ValueRules
from rlfleet.common.config import TableConfig
from rlfleet.common.wire.codec import DTYPE_NAMES
from rlfleet.common.wire.frames import FRAMES, unpack_frames
from rlfleet.services.replay.frames import (
    FrameColumns,
    Layout,
    PackedError,
    PackedLayouts,
    expand_snapshot,
    frame_columns,
    rows_of_layout,
)
from rlfleet.services.replay.prefault import Prefaulter, lazy_zeros
from rlfleet.services.replay.ratelimiter import RateLimiter


class TableError(Exception):
    """A request a table refuses; ``reason`` becomes the error reply's reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ColumnSpec:
    dtype: np.dtype[Any]
    shape: tuple[int, ...]  # per item (without the batch axis)

    def describe(self) -> str:
        return f"{self.dtype.name}{list(self.shape)}"


Schema = dict[str, ColumnSpec]
#: per column: its bytes, where its array starts in a packed payload, bytes per item
PackedPlan = list[tuple[memoryview, int, int]]


@dataclass
class Sampled:
    keys: np.ndarray  # uint64
    probability: np.ndarray  # float64
    data: dict[str, np.ndarray]


def batch_schema(arrays: Mapping[str, np.ndarray]) -> tuple[int, Schema]:
    """(N, schema) of a batch of columns that all share a leading axis of length N."""
    if not arrays:
        raise TableError("bad_batch", "an insert needs at least one data column")
    n = None
    schema: Schema = {}
    for name, arr in arrays.items():
        if arr.ndim < 1:
            raise TableError("bad_batch", f"column {name!r} has no batch axis (shape [])")
        if n is None:
            n = arr.shape[0]
        elif arr.shape[0] != n:
            raise TableError("bad_batch", f"column {name!r} has {arr.shape[0]} items, others have {n}")
        schema[name] = ColumnSpec(arr.dtype.newbyteorder("="), tuple(arr.shape[1:]))
    assert n is not None
    if n < 1:
        raise TableError("bad_batch", "an insert needs at least one item")
    return n, schema


class Table:
    kind = ""
    stores_frames_once = True  # a kind whose items are overwritten in ring order can share frames

    def __init__(self, cfg: TableConfig, rng: np.random.Generator | None = None) -> None:
        self.name = cfg.name
        self.capacity = cfg.capacity
        self.limiter = RateLimiter(cfg.min_size, cfg.samples_per_insert, cfg.error_buffer)
        self.rng = rng if rng is not None else np.random.default_rng()
        self.schema: Schema | None = None
        self.values: ValueRules = {}  # what declared columns' values may be (the algorithm's; none otherwise)
        self._signature: Layout | None = None
        self._packed = PackedLayouts()  # the same for inserts with packed frames
        self.generation = 0  # counts allocations of the columns: a packed_plan is for one generation
        self._prefault: Prefaulter | None = None
        self.columns: dict[str, np.ndarray] = {}
        self.dedup_frames = cfg.frames == "auto" and self.stores_frames_once
        self.frames: FrameColumns | None = None  # image-stack columns kept as frame references (frames.py)
        self.next_key = 0
        self.size = 0
        self.inserted_items = 0
        self.sampled_items = 0
        self.ignored_updates = 0

    # -- schema ---------------------------------------------------------------
    def check(self, arrays: Mapping[str, np.ndarray]) -> int:
        """Validate a batch against the schema (fixing it on first use); returns N. A batch may come with its
        image stacks packed (common/wire/frames.py): checked as the stacks it stands for."""
        if FRAMES in arrays:
            try:
                return self._packed.check(arrays, self._check, self.capacity)
            except PackedError as exc:
                raise TableError("bad_frames", str(exc)) from None
        n = self.known_batch(arrays)
        if n is not None:
            return n
        n = self._check(arrays)
        self._signature = tuple((k, a.dtype, a.shape[1:]) for k, a in arrays.items())
        return n

    def known_batch(self, arrays: Mapping[str, np.ndarray]) -> int | None:
        """N if ``arrays`` has the very columns (names, order, dtypes, item shapes) of the last
        batch that passed :meth:`check`, and 1 <= N <= capacity; None if it needs the full check."""
        n = rows_of_layout(self._signature, arrays)
        return n if n is not None and 0 < n <= self.capacity else None

    def _check(self, arrays: Mapping[str, np.ndarray]) -> int:
        n, schema = batch_schema(arrays)
        if n > self.capacity:
            raise TableError("batch_too_large", f"{n} items in one insert; table {self.name!r} holds {self.capacity}")
        if self.schema is None:
            self._allocate(schema)
            return n
        for name, spec in self.schema.items():
            got = schema.get(name)
            if got is None:
                raise TableError("schema_mismatch", f"column {name!r} is missing; table {self.name!r} stores "
                                 f"{sorted(self.schema)}")
            if got.dtype != spec.dtype:
                raise TableError("schema_mismatch", f"column {name!r} has dtype {got.dtype.name}; table "
                                 f"{self.name!r} stores {spec.dtype.name}")
            if got.shape != spec.shape:
                raise TableError("schema_mismatch", f"column {name!r} has per-item shape {list(got.shape)}; "
                                 f"table {self.name!r} stores {list(spec.shape)}")
        extra = sorted(set(schema) - set(self.schema))
        if extra:
            raise TableError("schema_mismatch", f"column {extra[0]!r} is unknown; table {self.name!r} stores "
                             f"{sorted(self.schema)}")
        return n

    def declare(self, columns: Mapping[str, tuple[str, tuple[int, ...]]], values: ValueRules | None = None) -> None:
        """Fix the columns before any insert: (dtype name, per-item shape) each, as the algorithm's
        adder emits them, and what their values may be (``values``, checked by :meth:`value_problem`
        at every insert). A table restored with other columns raises TableError."""
        self.values = dict(values or {})
        declared = {name: ColumnSpec(np.dtype(dtype), tuple(shape)) for name, (dtype, shape) in columns.items()}
        if self.schema is None:
            self._allocate(declared)
        elif self.schema != declared:
            have = {k: v.describe() for k, v in self.schema.items()}
            want = {k: v.describe() for k, v in declared.items()}
            raise TableError("schema_mismatch", f"table {self.name!r} holds columns {have}; the algorithm emits {want}")

    def value_problem(self, arrays: Mapping[str, np.ndarray]) -> str | None:
        """What is wrong with the values of a batch that fits the schema (None: nothing)."""
        for name, rule in self.values.items():
            column = arrays.get(name)
            if column is not None and (problem := rule.problem(name, column)) is not None:
                return problem
        return None

    def _allocate(self, schema: Schema) -> None:
        self.schema = dict(schema)
        self._signature, self._packed = None, PackedLayouts()
        self.generation += 1
        self.columns = {name: lazy_zeros((self.capacity, *s.shape), s.dtype) for name, s in schema.items()}
        self.frames = None
        stacks = frame_columns(schema) if self.dedup_frames else []
        shapes = {schema[name].shape[1:] for name in stacks}
        if len(shapes) == 1:  # one pool for the stacks of one frame shape (obs and next_obs share frames)
            self.frames = FrameColumns(stacks, shapes.pop(), self.capacity)
            for name in stacks:  # -1: a slot that holds no item's frames yet
                self.columns[name] = np.full((self.capacity, schema[name].shape[0]), -1, np.int32)
        if self._prefault is not None:
            self._prefault.close()
        # pages made resident ahead of the first lap of writes (services/replay/prefault.py)
        self._prefault = Prefaulter(list(self.columns.values()), min(self.next_key, self.capacity), self.name)

    # -- keys -----------------------------------------------------------------
    @property
    def oldest_key(self) -> int:
        return self.next_key - self.size

    def present(self, keys: np.ndarray) -> np.ndarray:
        k = keys.astype(np.uint64, copy=False)
        return (k >= np.uint64(self.oldest_key)) & (k < np.uint64(self.next_key))

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        return (keys % np.uint64(self.capacity)).astype(np.int64)

    # -- insert ---------------------------------------------------------------
    def can_insert(self, n: int) -> bool:
        return self.limiter.can_insert(self.size)

    def insert(self, arrays: Mapping[str, np.ndarray], priority: np.ndarray | None = None, n: int | None = None) -> int:
        """Store a batch (``n``: already checked, of that many items); returns the key of its first item."""
        n = self.check(arrays) if n is None else n
        first = self.next_key
        start = first % self.capacity
        head = min(n, self.capacity - start)  # contiguous slices, not fancy indexing: 5x faster
        if self.frames is not None:
            replaced = {name: np.concatenate([self.columns[name][start:start + head], self.columns[name][:n - head]])
                        for name in self.frames.names}
            store = self.frames.store_packed if FRAMES in arrays else self.frames.store
            arrays = store(arrays, replaced)
        elif FRAMES in arrays:  # this table keeps whole stacks
            arrays = unpack_frames(arrays)
        if head == n:
            for name, col in self.columns.items():
                col[start:start + n] = arrays[name]
        else:  # the batch wraps around the end of the ring
            for name, col in self.columns.items():
                a = arrays[name]
                col[start:] = a[:head]
                col[:n - head] = a[head:]
        self._advance(first, n, priority)
        return first

    def _advance(self, first: int, n: int, priority: np.ndarray | None) -> None:
        """The bookkeeping of ``n`` items just written at key ``first`` on."""
        self._stored(first, n, priority)
        self.next_key += n
        if self._prefault is not None:
            self._prefault.advance(self.next_key)
        self.size = min(self.size + n, self.capacity)
        self.inserted_items += n
        self.limiter.inserted(n)

    def packed_plan(self, items: Sequence[tuple[str, np.dtype[Any], tuple[int, ...], int]]) -> PackedPlan | None:
        """How to copy a packed payload of this layout (``(name, dtype, shape, offset)`` per array,
        as the decoder describes a checked packed layout) straight into the columns: per column,
        its bytes, the array's offset in the payload and the bytes of one item. None if a column
        is missing from it, or its bytes are not the column's (another dtype; a big-endian host)."""
        if sys.byteorder != "little" or self.schema is None or self.frames is not None:
            return None
        found = {name: (dtype, shape, offset) for name, dtype, shape, offset in items}
        plan = []
        for name, col in self.columns.items():
            got = found.get(name)
            if got is None or got[0] != col.dtype or got[1][1:] != col.shape[1:]:
                return None
            if col.nbytes == 0:  # a zero-width column: nothing to copy (and no byte view of it)
                continue
            plan.append((memoryview(col.data).cast("B"), got[2], col.itemsize * (col.size // self.capacity)))
        return plan

    def insert_packed(self, plan: PackedPlan, payload: Any, n: int, priority: np.ndarray | None = None) -> int:
        """:meth:`insert` of a checked packed batch of ``n`` items, copied from the payload frame's
        bytes by a :meth:`packed_plan` of its layout (no array per column); returns its first key."""
        first = self.next_key
        start = first % self.capacity
        head = min(n, self.capacity - start)
        src = memoryview(payload)
        if head == n:
            for dst, offset, row in plan:
                dst[start * row:(start + n) * row] = src[offset:offset + n * row]
        else:  # the batch wraps around the end of the ring
            for dst, offset, row in plan:
                dst[start * row:] = src[offset:offset + head * row]
                dst[:(n - head) * row] = src[offset + head * row:offset + n * row]
        self._advance(first, n, priority)
        return first

    def _stored(self, first: int, n: int, priority: np.ndarray | None) -> None:
        """Hook: per-item bookkeeping of the items just written (keys first..first+n-1)."""

    # -- sample ---------------------------------------------------------------
    def can_sample(self) -> bool:
        return self.size >= 1 and self.limiter.can_sample(self.size)

    def can_sample_unlimited(self) -> bool:
        """May a sample the limiter does not count (``rate_limited: false``) go? Once min_size is held."""
        return self.size >= max(1, self.limiter.min_size)

    def sample(self, batch_size: int, *, counted: bool = True) -> Sampled:
        """``counted=False``: the limiter does not count these items (``sampled_items`` still does)."""
        keys, prob = self._select(batch_size)
        slots = self._slots(keys)
        data = {name: col[slots] for name, col in self.columns.items()}
        if self.frames is not None:
            self.frames.expand(data)
        self.sampled_items += len(keys)
        if counted:
            self.limiter.sampled(len(keys))
        return Sampled(keys, prob, data)

    def _select(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The keys of a sample and each one's probability of being drawn."""
        raise NotImplementedError

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Tables without priorities ignore updates (all counted as ignored)."""
        self.ignored_updates += len(keys)
        return 0

    # -- snapshot -------------------------------------------------------------
    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(meta, arrays) of the live items in key order; arrays are copies."""
        keys = np.arange(self.oldest_key, self.next_key, dtype=np.uint64)
        slots = self._slots(keys)
        arrays = {name: col[slots] for name, col in self.columns.items()}
        if self.frames is not None:  # the frames the live items use, once; their references renumbered
            frames, refs = self.frames.pool.export([arrays[name] for name in self.frames.names])
            arrays.update(zip(self.frames.names, refs, strict=True))
            arrays[FRAMES] = frames
        meta = {
            "kind": self.kind,
            "capacity": self.capacity,
            "next_key": self.next_key,
            "size": self.size,
            "schema": {n: [s.dtype.str, list(s.shape)] for n, s in (self.schema or {}).items()},
            "limiter": self.limiter.state(),
            "inserted_items": self.inserted_items,
            "sampled_items": self.sampled_items,
        }
        return meta, arrays

    def restore(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> int:
        """Load a state(); keeps the newest items if the capacity shrank. Returns items restored."""
        if meta["kind"] != self.kind:
            raise TableError("bad_snapshot", f"table {self.name!r} is {self.kind}, snapshot holds {meta['kind']}")
        schema = {n: ColumnSpec(np.dtype(d), tuple(s)) for n, (d, s) in meta["schema"].items()}
        self.next_key = int(meta["next_key"])
        size = int(meta["size"])
        keep = min(size, self.capacity)
        self.size = 0
        if schema:
            self._allocate(schema)
            keys = np.arange(self.next_key - keep, self.next_key, dtype=np.uint64)
            slots = self._slots(keys)
            stored = dict(arrays)
            if self.frames is not None or FRAMES in arrays:
                stored.update(self._restore_frames(arrays, size - keep))
            for name, col in self.columns.items():
                col[slots] = stored[name][size - keep:]
            self._restored(slots, arrays, size - keep)
        self.size = keep
        self.limiter.restore(meta.get("limiter", {}))
        self.inserted_items = int(meta.get("inserted_items", 0))
        self.sampled_items = int(meta.get("sampled_items", 0))
        return keep

    def _restore_frames(self, arrays: Mapping[str, np.ndarray], skip: int) -> dict[str, np.ndarray]:
        """The stored form of a snapshot's image-stack columns: references into this table's pool, or
        whole stacks if this table keeps none (``frames: off``); rows before ``skip`` unused."""
        if self.frames is None:
            return expand_snapshot(arrays, self.columns, skip)
        return self.frames.restore(arrays, skip)

    def _restored(self, slots: np.ndarray, arrays: Mapping[str, np.ndarray], skip: int) -> None:
        """Hook: per-item bookkeeping after a restore."""

    def close(self) -> None:
        if self._prefault is not None:
            self._prefault.close()

    def stats(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "size": self.size,
            "capacity": self.capacity,
            "next_key": self.next_key,
            "inserted_items": self.inserted_items,
            "sampled_items": self.sampled_items,
            "ignored_priority_updates": self.ignored_updates,
            "limiter_inserts": self.limiter.inserts,
            "limiter_samples": self.limiter.samples,
            "limiter_diff": self.limiter.diff,
            # the columns its first insert fixed, as "dtype[per-item shape]": every later insert must
            # match (null: none yet)
            "schema": None if self.schema is None else
            {n: f"{DTYPE_NAMES.get(sp.dtype, sp.dtype.str)}{list(sp.shape)}" for n, sp in self.schema.items()},
            # image stacks kept as shared frames (none: each item keeps its own), the frames held, and
            # what an item costs
            "frame_columns": [] if self.frames is None else self.frames.names,
            "frames_stored": 0 if self.frames is None else self.frames.pool.live,
            "bytes_per_item": round(self.bytes_per_item(), 1),
        }

    def bytes_per_item(self) -> float:
        """Bytes the live items take in this table: their columns' rows and, with shared frames, the frames."""
        row = sum(col.itemsize * (col.size // self.capacity) for col in self.columns.values())
        if not self.size:
            return float(row)
        return row + (self.frames.pool.nbytes / self.size if self.frames is not None else 0.0)
