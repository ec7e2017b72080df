"""Image stacks on the wire with each frame once: what an insert of Atari transitions sends.

An insert's image-stack columns (uint8 ``[n, stack, h, w]``: ``obs`` and
``next_obs`` of stacked frames) repeat most frames: 64 Pong transitions hold
512 frames of which about 80 differ. :func:`pack_frames` sends the distinct
frames once, as the array ``__frames__`` (uint8 ``[F, h, w]``, last in the
message), and each stack column ``obs`` as ``obs@frames``: int32 ``[n, stack]``
indices into it (a PPO segment's ``[n, steps, stack]``);
replay checks the indices and rebuilds or shares the frames
(services/replay/frames.py). Priorities are computed before packing, on the
stacks.

:class:`FrameIndex` finds a frame among frames already seen by its hash
(:func:`frame_hashes`) and then compares the bytes: equal content is the only
way to share a slot, so a hash collision, accidental or crafted, costs a
lookup and never mixes two frames.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import numpy as np

FRAMES = "__frames__"
PACKED = "@frames"  # suffix of a stack column sent as indices into FRAMES
MAX_STACK = 64
MIN_SIDE = 8


def is_image_stack(dtype: np.dtype, item_shape: tuple[int, ...]) -> bool:
    """uint8 items of shape [stack, h, w]: frames stacked on the first axis."""
    return (dtype == np.uint8 and len(item_shape) == 3 and 1 <= item_shape[0] <= MAX_STACK
            and min(item_shape[1:]) >= MIN_SIDE)


_KEYS = np.zeros(0, np.uint64)


def _keys(words: int) -> np.ndarray:
    """This process's random odd 64-bit multipliers, one per word of a frame (drawn once, grown on demand)."""
    global _KEYS
    if len(_KEYS) < words:
        more = np.frombuffer(os.urandom(8 * (words - len(_KEYS))), np.uint64) | np.uint64(1)
        _KEYS = np.concatenate([_KEYS, more])
    return _KEYS[:words]


def frame_hashes(flat: np.ndarray) -> list[int]:
    """A 63-bit hash of each row of ``flat`` (uint8 [frames, bytes]), all rows in one numpy call.

    The sum of the row's 64-bit words times random odd multipliers, modulo 2^64 (a multilinear
    hash), its lowest bit dropped: two frames that differ in one word collide only if that
    difference times its multiplier is +-1 (odds ~2^-63), and the multipliers are this process's
    own, so no client can aim collisions at another's frames. Three times faster than
    a CRC-32 per frame here; equality is always decided by the bytes (:class:`FrameIndex`).
    """
    flat = np.ascontiguousarray(flat, np.uint8)
    if flat.shape[1] % 8:
        flat = np.pad(flat, ((0, 0), (0, -flat.shape[1] % 8)))
    words = flat.view(np.uint64)
    return ((words @ _keys(words.shape[1])) >> np.uint64(1)).tolist()  # type: ignore[no-any-return]


class FrameIndex:
    """Hash -> the slots of frames with that hash (:func:`frame_hashes`); a hit counts only if the bytes
    are equal."""

    def __init__(self) -> None:
        self._slots: dict[int, int | list[int]] = {}

    def find(self, key: int, row: np.ndarray, frame: Callable[[int], np.ndarray]) -> int | None:
        """The slot holding the bytes of ``row`` (``frame(slot)`` gives a slot's frame, flat), or None."""
        found = self._slots.get(key)
        if found is None:
            return None
        for slot in (found,) if isinstance(found, int) else found:
            if frame(slot).tobytes() == row.tobytes():  # memcmp: a sixth of np.array_equal's cost
                return slot
        return None

    def add(self, key: int, slot: int) -> None:
        found = self._slots.get(key)
        if found is None:
            self._slots[key] = slot
        elif isinstance(found, int):
            self._slots[key] = [found, slot]
        else:
            found.append(slot)

    def assign(self, flat: np.ndarray, frame: Callable[[int], np.ndarray],
               store: Callable[[np.ndarray, int], int]) -> np.ndarray:
        """The slot (int32) of each row of ``flat`` ([frames, h*w]): a known frame's, else the one
        ``store(row, hash)`` puts the row in (then indexed under it); ``frame(slot)`` gives a slot's frame, flat."""
        out = np.empty(len(flat), np.int32)
        for i, (row, key) in enumerate(zip(flat, frame_hashes(flat), strict=True)):
            slot = self.find(key, row, frame)
            if slot is None:
                slot = store(row, key)
                self.add(key, slot)
            out[i] = slot
        return out

    def lookup(self, hashes: list[int]) -> list[int | list[int] | None]:
        """What each hash maps to (a slot, several, or None), bytes not compared: for bulk callers that
        compare the hits themselves."""
        return list(map(self._slots.get, hashes))

    def add_new(self, hashes: list[int], slots: list[int]) -> None:
        """:meth:`add` of hashes known to be absent and distinct."""
        self._slots.update(zip(hashes, slots, strict=True))

    def remove_many(self, hashes: list[int], slots: list[int]) -> None:
        for key, slot in zip(hashes, slots, strict=True):
            if self._slots.get(key) == slot:
                del self._slots[key]
            else:
                self.remove(key, slot)

    def remove(self, key: int, slot: int) -> None:
        found = self._slots.get(key)
        if found == slot:
            del self._slots[key]
        elif isinstance(found, list) and slot in found:
            found.remove(slot)
            if len(found) == 1:
                self._slots[key] = found[0]


def has_frames(a: np.ndarray) -> bool:
    """uint8 items made of frames on their last two axes: stacks [n, stack, h, w], also segments of stacks
    [n, steps, stack, h, w] (PPO)."""
    return a.dtype == np.uint8 and a.ndim >= 4 and min(a.shape[-2:]) >= MIN_SIDE


def pack_frames(columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``columns`` with every column of frames (:func:`has_frames`) as int32 indices into one ``__frames__``
    array of the distinct frames (appended last); unchanged when there is none, or their frame shapes differ."""
    names = [k for k, a in columns.items() if has_frames(a)]
    if not names or len({columns[k].shape[-2:] for k in names}) != 1 or FRAMES in columns:
        return dict(columns)
    frame_shape = columns[names[0]].shape[-2:]
    index = FrameIndex()
    rows: list[np.ndarray] = []

    def store(row: np.ndarray, _hash: int) -> int:
        rows.append(row)
        return len(rows) - 1

    out = dict(columns)
    for name in names:
        stacks = np.ascontiguousarray(columns[name])
        flat = stacks.reshape(-1, frame_shape[0] * frame_shape[1])
        out[name] = index.assign(flat, rows.__getitem__, store).reshape(stacks.shape[:-2])
    # the columns in their order (the first one's rows are the items), the stacks renamed, frames last
    packed = {(k + PACKED if k in names else k): v for k, v in out.items()}
    packed[FRAMES] = np.stack(rows).reshape(len(rows), *frame_shape)
    return packed


def packed_name(name: str) -> str | None:
    """The stack column a packed column ``<name>@frames`` stands for, else None."""
    return name[:-len(PACKED)] if name.endswith(PACKED) and len(name) > len(PACKED) else None


def unpack_frames(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A packed insert with its stacks rebuilt (indices already checked), under their own names."""
    if FRAMES not in arrays:
        return dict(arrays)
    frames = arrays[FRAMES]
    out = {}
    for name, a in arrays.items():
        stack = packed_name(name)
        if stack is not None:
            out[stack] = frames[a]
        elif name != FRAMES:
            out[name] = a
    return out
