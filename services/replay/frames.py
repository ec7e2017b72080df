"""Frame-deduplicated storage of image-stack columns: each frame stored once.

An Atari transition carries ``obs`` and ``next_obs`` as uint8 stacks of 4
frames each, and consecutive transitions share all but one of them: stored
as given, a transition costs 8 frames where it brings one new one. A table
with ``frames: auto`` keeps such columns (uint8, per-item shape [stack, h, w])
as int32 references into one :class:`FramePool` per frame shape, and
rebuilds the stacks when it samples them.

The pool is content-addressed: a frame's key is its BLAKE2b-128 digest, so
sharing needs no knowledge of actors, envs, episode boundaries or n-step
(what the stacks held is what comes back, across resets and ring
wrap-around), and a client cannot make its frame stand for another's
without a BLAKE2b collision. Each frame counts its references; a frame no
item references any more is freed when the last one is overwritten.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

MAX_STACK = 64
MIN_SIDE = 8


def frame_columns(schema: Mapping[str, Any]) -> list[str]:
    """The columns of ``schema`` (name -> ColumnSpec) that are image stacks: uint8 [stack, h, w]."""
    return [name for name, spec in schema.items()
            if spec.dtype == np.uint8 and len(spec.shape) == 3 and 1 <= spec.shape[0] <= MAX_STACK
            and min(spec.shape[1:]) >= MIN_SIDE]


class FramePool:
    """Frames of one shape, each stored once, with reference counts; slots are reused once freed."""

    def __init__(self, frame_shape: tuple[int, ...], dtype: np.dtype[Any], initial: int = 1024) -> None:
        self.frame_shape = tuple(frame_shape)
        self.frame_bytes = int(np.prod(frame_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        self.frames = np.zeros((max(1, initial), *frame_shape), dtype)
        self.refs = np.zeros(len(self.frames), np.int64)
        self._digests: list[bytes | None] = [None] * len(self.frames)
        self._index: dict[bytes, int] = {}
        self._free: list[int] = []
        self._top = 0  # slots at and past it were never used

    @property
    def live(self) -> int:
        """Frames held (referenced by at least one item)."""
        return len(self._index)

    @property
    def nbytes(self) -> int:
        """Bytes of the frames held."""
        return self.live * self.frame_bytes

    def _slot(self) -> int:
        if self._free:
            return self._free.pop()
        if self._top == len(self.frames):  # full: double (amortised; freed slots are reused first)
            grow = len(self.frames)
            self.frames = np.concatenate([self.frames, np.zeros_like(self.frames[:grow])])
            self.refs = np.concatenate([self.refs, np.zeros(grow, np.int64)])
            self._digests += [None] * grow
        self._top += 1
        return self._top - 1

    def intern(self, stacks: np.ndarray) -> np.ndarray:
        """References (int32 [n, stack]) to the frames of ``stacks`` ([n, stack, *frame_shape]), each frame
        stored if new; every reference returned is counted (release it with :meth:`release`)."""
        n, stack = stacks.shape[:2]
        flat = np.ascontiguousarray(stacks).reshape(n * stack, -1)
        out = np.empty(n * stack, np.int32)
        index = self._index
        for i in range(n * stack):
            row = flat[i]
            digest = hashlib.blake2b(row, digest_size=16).digest()  # type: ignore[arg-type]
            slot = index.get(digest)
            if slot is None:
                slot = self._slot()
                self.frames[slot] = row.reshape(self.frame_shape)
                index[digest] = slot
                self._digests[slot] = digest
            out[i] = slot
        np.add.at(self.refs, out, 1)
        return out.reshape(n, stack)

    def release(self, refs: np.ndarray) -> None:
        """Drop references (negative ones are empty slots: ignored); frames left unreferenced are freed."""
        refs = refs[refs >= 0].ravel()
        if not refs.size:
            return
        np.subtract.at(self.refs, refs, 1)
        for slot in np.unique(refs[self.refs[refs] == 0]).tolist():
            digest = self._digests[slot]
            if digest is not None:
                del self._index[digest]
                self._digests[slot] = None
                self._free.append(slot)

    def gather(self, refs: np.ndarray) -> np.ndarray:
        """The stacks of ``refs`` (int32 [n, stack]): [n, stack, *frame_shape]."""
        return self.frames[refs]

    def export(self, refs: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """(the frames ``refs`` use, in one compact array; ``refs`` renumbered into it): a snapshot's copy."""
        used = np.unique(np.concatenate([r.ravel() for r in refs])) if refs else np.zeros(0, np.int32)
        used = used[used >= 0]
        return self.frames[used], [np.searchsorted(used, r).astype(np.int32) for r in refs]

    def load(self, frames: np.ndarray, refs: list[np.ndarray]) -> list[np.ndarray]:
        """Intern a snapshot's ``frames`` and count ``refs`` (indices into them); the pool's own references."""
        if not len(frames):
            return [r.astype(np.int32) for r in refs]
        mine = self.intern(frames[:, None])[:, 0]
        out = [mine[r].astype(np.int32) for r in refs]
        for r in out:
            np.add.at(self.refs, r.ravel(), 1)
        self.release(mine)  # interning counted each frame once: only the items' references count
        return out


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
        for refs in replaced.values():
            self.pool.release(refs)
        return out

    def expand(self, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Sampled columns with the stacks rebuilt (in place)."""
        for name in self.names:
            data[name] = self.pool.gather(data[name])
        return data
