"""Frame-deduplicated storage of image-stack columns: each frame stored once.

An Atari transition carries ``obs`` and ``next_obs`` as uint8 stacks of 4
frames each, and consecutive transitions share all but one of them: stored
as given, a transition costs 8 frames where it brings one new one. A table
with ``frames: auto`` keeps such columns (uint8, per-item shape [stack, h, w])
as int32 references into one :class:`FramePool` per frame shape, and
rebuilds the stacks when it samples them.

The pool is content-addressed (:class:`~rlfleet.common.wire.frames.FrameIndex`: a
hash, then the bytes compared), so sharing needs no knowledge of actors,
envs, episode boundaries or n-step: what the stacks held is what comes back,
across resets and ring wrap-around, and no client can make its frame stand
for another's. Each frame counts its references; a frame no item references
any more is freed when the last one is overwritten.

Inserts may arrive packed (common/wire/frames.py: each distinct frame once,
the stacks as indices): :func:`check_packed` checks the
indices, and the frames go into the pool without being unpacked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlfleet.common.wire.frames import (
    FRAMES,
    MIN_SIDE,
    FrameIndex,
    frame_hashes,
    is_image_stack,
    packed_name,
    unpack_frames,
)


def frame_columns(schema: Mapping[str, Any]) -> list[str]:
    """The columns of ``schema`` (name -> ColumnSpec) that are image stacks: uint8 [stack, h, w]."""
    return [name for name, spec in schema.items() if is_image_stack(spec.dtype, spec.shape)]


class PackedError(ValueError):
    """A packed insert whose frames or indices do not fit the table."""


class FramePool:
    """Frames of one shape, each stored once, with reference counts; slots are reused once freed."""

    def __init__(self, frame_shape: tuple[int, ...], dtype: np.dtype[Any], initial: int = 1024) -> None:
        self.frame_shape = tuple(frame_shape)
        self.frame_bytes = int(np.prod(frame_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        self.frames = np.zeros((max(1, initial), *frame_shape), dtype)
        self.refs = np.zeros(len(self.frames), np.int64)
        self._hashes = np.full(len(self.frames), -1, np.int64)  # the hash of each slot in use, -1 if free
        self._index = FrameIndex()
        self._live = 0
        self._free: list[int] = []
        self._top = 0  # slots at and past it were never used

    @property
    def live(self) -> int:
        """Frames held (referenced by at least one item)."""
        return self._live

    @property
    def nbytes(self) -> int:
        """Bytes of the frames held."""
        return self.live * self.frame_bytes

    def _take(self, k: int) -> np.ndarray:
        """``k`` free slots: freed ones first, then never-used ones (the pool doubles when it runs out)."""
        reuse = self._free[len(self._free) - min(k, len(self._free)):]
        del self._free[len(self._free) - len(reuse):]
        fresh = k - len(reuse)
        while self._top + fresh > len(self.frames):  # amortised: freed slots are reused first
            grow = len(self.frames)
            self.frames = np.concatenate([self.frames, np.zeros_like(self.frames[:grow])])
            self.refs = np.concatenate([self.refs, np.zeros(grow, np.int64)])
            self._hashes = np.concatenate([self._hashes, np.full(grow, -1, np.int64)])
        slots = np.array([*reuse, *range(self._top, self._top + fresh)], np.int64)
        self._top += fresh
        return slots

    def intern(self, stacks: np.ndarray) -> np.ndarray:
        """References (int32 [n, stack]) to the frames of ``stacks`` ([n, stack, *frame_shape]), each frame
        stored if new; every reference returned is counted (release it with :meth:`release`)."""
        n, stack = stacks.shape[:2]
        out = self._index.assign(np.ascontiguousarray(stacks).reshape(n * stack, -1), self._flat, self._store)
        np.add.at(self.refs, out, 1)
        return out.reshape(n, stack)

    def _store(self, row: np.ndarray, key: int) -> int:
        """A new frame into a free slot (indexed by the caller under its hash ``key``); its slot."""
        slot = int(self._take(1)[0])
        self.frames[slot] = row.reshape(self.frame_shape)
        self._hashes[slot] = key
        self._live += 1
        return slot

    def intern_distinct(self, frames: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        """:meth:`intern` of frames that are (claimed) distinct, [F, *frame_shape] -> slots [F], each counted
        ``counts`` times (default once): what a packed insert brings. The frames are hashed, looked up,
        compared, stored and indexed in bulk; a hash seen twice in the batch, or a known one whose
        bytes differ, takes the frame-by-frame path (never mixes frames)."""
        flat = np.ascontiguousarray(frames).reshape(len(frames), -1)
        keys = frame_hashes(flat)
        found = self._index.lookup(keys)
        hits = [i for i, f in enumerate(found) if f is not None]
        known: list[Any] = [found[i] for i in hits]  # slots once checked to be ints
        if len(set(keys)) != len(keys) or any(type(f) is not int for f in known) or (
                hits and not np.array_equal(self.frames[known].reshape(len(hits), -1), flat[hits])):
            out = self.intern(frames[:, None])[:, 0].astype(np.int64)
            if counts is not None:
                np.add.at(self.refs, out, counts - 1)
            return out
        out = np.empty(len(flat), np.int64)
        if hits:
            out[hits] = known
        if len(hits) < len(flat):
            misses = [i for i, f in enumerate(found) if f is None]
            slots = self._take(len(misses))
            self.frames[slots] = frames if len(misses) == len(flat) else frames[misses]
            miss_keys = [keys[i] for i in misses]
            self._index.add_new(miss_keys, slots.tolist())
            self._hashes[slots] = miss_keys
            self._live += len(misses)
            out[misses] = slots
        self.refs[out] += 1 if counts is None else counts  # distinct slots: no repeated index
        return out

    def _flat(self, slot: int) -> np.ndarray:
        return self.frames[slot].reshape(-1)

    def release(self, refs: np.ndarray) -> None:
        """Drop references (negative ones are empty slots: ignored); frames left unreferenced are freed."""
        refs = refs[refs >= 0].ravel()
        if not refs.size:
            return
        np.subtract.at(self.refs, refs, 1)
        gone = np.unique(refs[self.refs[refs] == 0])
        gone = gone[self._hashes[gone] >= 0]
        if len(gone):
            self._index.remove_many(self._hashes[gone].tolist(), gone.tolist())
            self._hashes[gone] = -1
            self._free.extend(gone.tolist())
            self._live -= len(gone)

    def gather(self, refs: np.ndarray) -> np.ndarray:
        """The stacks of ``refs`` (int32 [n, stack]): [n, stack, *frame_shape]."""
        return self.frames[refs]

    def export(self, refs: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """(the frames ``refs`` use, in one compact array; ``refs`` renumbered into it): a snapshot's copy."""
        used = np.unique(np.concatenate([r.ravel() for r in refs])) if refs else np.zeros(0, np.int32)
        used = used[used >= 0]
        return self.frames[used], [np.searchsorted(used, r).astype(np.int32) for r in refs]

    def load(self, frames: np.ndarray, refs: list[np.ndarray]) -> list[np.ndarray]:
        """Intern a snapshot's or a packed insert's ``frames`` and count ``refs`` (indices into them); the
        pool's own references. A frame no reference uses is not stored."""
        if not len(frames):
            return [r.astype(np.int32) for r in refs]
        counts = np.bincount(np.concatenate([r.ravel() for r in refs]), minlength=len(frames)) if refs else \
            np.zeros(len(frames), np.int64)
        used = counts > 0
        if used.all():
            mine = self.intern_distinct(frames, counts)
        else:  # an unused frame would be stored with no reference to free it
            mine = np.full(len(frames), -1, np.int64)
            mine[used] = self.intern_distinct(frames[used], counts[used])
        return [mine[r].astype(np.int32) for r in refs]


class FrameColumns:
    """The image-stack columns of one table and their pool: what the table stores instead of the stacks."""

    def __init__(self, names: list[str], frame_shape: tuple[int, ...], capacity: int) -> None:
        self.names = names
        self.pool = FramePool(frame_shape, np.dtype(np.uint8), initial=min(capacity, 4096) * 2)

    def store(self, arrays: Mapping[str, np.ndarray], replaced: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``arrays`` with the stack columns as references (new frames stored); then the references of the
        items they replace (``replaced``: each column's refs in the slots about to be written) are released."""
        out = dict(arrays)
        for name in self.names:
            out[name] = self.pool.intern(arrays[name])
        self.pool.release(np.concatenate(list(replaced.values()), axis=None))
        return out

    def store_packed(self, arrays: Mapping[str, np.ndarray], replaced: dict[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
        """:meth:`store` of a packed insert (checked by :func:`check_packed`): only its distinct frames
        are looked up; the stack columns become references to them."""
        packed = {packed_name(k): v for k, v in arrays.items() if packed_name(k) is not None}
        out = {k: v for k, v in arrays.items() if k != FRAMES and packed_name(k) is None}
        if set(packed) != set(self.names):  # some stacks whole: looked up frame by frame
            out.update({k: v for k, v in unpack_frames(arrays).items() if k in packed})
            return self.store(out, replaced)
        refs = self.pool.load(arrays[FRAMES], [packed[name] for name in self.names])
        out.update(zip(self.names, refs, strict=True))
        self.pool.release(np.concatenate(list(replaced.values()), axis=None))
        return out

    def restore(self, arrays: Mapping[str, np.ndarray], skip: int) -> dict[str, np.ndarray]:
        """References into the pool for a snapshot's stack columns (rows before ``skip`` unused, -1):
        a snapshot of shared frames is loaded, one of whole stacks (taken with ``frames: off``) interned."""
        snap = arrays.get(FRAMES)
        kept = [arrays[name][skip:] for name in self.names]
        refs = [self.pool.intern(k) for k in kept] if snap is None else self.pool.load(snap, kept)
        return {name: np.concatenate([np.full((skip, r.shape[1]), -1, np.int32), r])
                for name, r in zip(self.names, refs, strict=True)}

    def expand(self, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Sampled columns with the stacks rebuilt (in place)."""
        for name in self.names:
            data[name] = self.pool.gather(data[name])
        return data


def check_packed(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
    """The columns a packed insert stands for ({name: (dtype, item shape)}, ``<name>@frames`` as the stack
    ``<name>``: uint8 [stack, h, w]), or PackedError naming what does not fit: the ``__frames__`` array, an
    index column, an index out of range."""
    frames = arrays[FRAMES]
    if frames.dtype != np.uint8 or frames.ndim != 3:
        raise PackedError(f"{FRAMES} is {frames.dtype.name}{list(frames.shape)}; allowed: uint8 [frames, h, w]")
    out: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {}
    for name, a in arrays.items():
        stack = packed_name(name)
        if name == FRAMES:
            continue
        if stack is None:
            out[name] = (a.dtype, a.shape[1:])
            continue
        shape = (*a.shape[1:], *frames.shape[1:])
        if a.dtype != np.int32 or a.ndim < 2 or min(frames.shape[1:]) < MIN_SIDE:
            raise PackedError(f"column {name!r} is {a.dtype.name}{list(a.shape)}; allowed: int32 [items, stack, ...] "
                              f"indices into {FRAMES} (uint8 [frames, h, w], h and w >= {MIN_SIDE})")
        if a.size and (int(a.min()) < 0 or int(a.max()) >= len(frames)):
            raise PackedError(f"column {name!r}: frame indices in [{int(a.min())}, {int(a.max())}]; {FRAMES} "
                              f"holds {len(frames)} frames")
        if stack in out:
            raise PackedError(f"column {stack!r} is sent both whole and as {name!r}")
        out[stack] = (np.dtype(np.uint8), shape)
    if not any(packed_name(name) for name in arrays):
        raise PackedError(f"{FRAMES} is sent, but no column <name>@frames indexes into it")
    return out


Layout = tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]  # (name, dtype, item shape) per column


def rows_of_layout(layout: Layout | None, arrays: Mapping[str, np.ndarray], other: str = "") -> int | None:
    """N if ``arrays`` has the columns of ``layout`` (names, order, dtypes, item shapes), each of N rows
    (but the column ``other``, of any length); else None."""
    if layout is None or len(arrays) != len(layout):
        return None
    n = -1
    for (name, dtype, item), (k, a) in zip(layout, arrays.items(), strict=True):
        shape = a.shape
        if k != name or a.dtype != dtype or not shape or shape[1:] != item:
            return None
        if k != other and n != shape[0]:
            if n != -1:
                return None
            n = shape[0]
    return n


class PackedLayouts:
    """The layout of the last packed insert that passed :func:`check_packed` and the table's check, so the
    next one of that layout only needs its indices checked (what differs between inserts)."""

    def __init__(self) -> None:
        self._signature: Layout | None = None
        self._indices: tuple[str, ...] = ()

    def check(self, arrays: Mapping[str, np.ndarray], check_logical: Callable[[dict[str, np.ndarray]], int],
              capacity: int) -> int:
        """N of a packed insert: its indices checked if its layout is the last one's, else it is checked in
        full (:func:`check_packed`, then ``check_logical`` of the stacks it stands for) and remembered."""
        n = self.known(arrays)
        if n is not None and 0 < n <= capacity:
            return n
        n = check_logical(logical_batch(arrays))
        self._signature = tuple((k, a.dtype, a.shape[1:]) for k, a in arrays.items())
        self._indices = tuple(k for k in arrays if packed_name(k) is not None)
        return n

    def known(self, arrays: Mapping[str, np.ndarray]) -> int | None:
        """N if ``arrays`` has the remembered columns (names, order, dtypes, item shapes), every column
        but the frames N rows and every index in range; None if it needs the full check."""
        n = rows_of_layout(self._signature, arrays, FRAMES)
        if n is None:
            return None
        frames = len(arrays[FRAMES])
        for k in self._indices:
            a = arrays[k]
            if not a.size or int(a.min()) < 0 or int(a.max()) >= frames:
                return None
        return n


def logical_batch(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What a packed insert stands for, checked (:func:`check_packed`), as zero-stride arrays of the
    stacks' shapes: a table checks them as any batch, without their bytes."""
    columns = check_packed(arrays)
    out = {}
    for name, a in arrays.items():
        if name == FRAMES:
            continue
        logical = packed_name(name) or name
        dtype, item = columns[logical]
        out[logical] = np.lib.stride_tricks.as_strided(np.zeros(1, dtype), (len(a), *item), (0,) * (1 + len(item)))
    return out


def expand_snapshot(arrays: Mapping[str, np.ndarray], columns: Mapping[str, np.ndarray], skip: int
                    ) -> dict[str, np.ndarray]:
    """Whole stacks again from a snapshot of shared frames, for a table that keeps no pool."""
    snap = arrays[FRAMES]
    return {n: np.concatenate([np.zeros((skip, *col.shape[1:]), np.uint8), snap[arrays[n][skip:]]])
            for n, col in columns.items() if arrays[n].ndim == 2 and col.ndim == 4}
