"""A sum tree over float64 priorities: vectorized batch updates and batch sampling.

A binary tree whose leaves are the (already alpha-scaled) priorities, padded
to a power of two. Every node is the sum of its two children and is always
recomputed from them (never incremented), so sums do not drift.

Speed comes from cutting the tree: only the bottom ``cut`` levels (8 by
default) are kept as levels; the level above them (the "top", at most
``2**(depth - cut)`` nodes, 4,096 for a million slots) is searched in one
step with a cumulative sum and ``np.searchsorted``. Sampling a batch is one
cumsum + one binary search in C + ``cut`` vector steps; updating a batch is
``cut`` vector steps. Both stay O(log n) per item with few numpy calls, which
is what costs in Python.
"""

from __future__ import annotations

import numpy as np

from rlfleet.services.replay.prefault import lazy_zeros


class SumTree:
    """Priorities of ``capacity`` slots."""

    def __init__(self, capacity: int, cut: int = 8) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.depth = max(0, (capacity - 1).bit_length())  # leaves = 2**depth
        self.top = max(0, self.depth - cut)
        # levels[i] holds the 2**(top + i) nodes of tree level top + i; levels[-1] are the leaves.
        self.levels = [lazy_zeros((1 << d,), np.float64) for d in range(self.top, self.depth + 1)]

    @property
    def total(self) -> float:
        return float(self.levels[0].sum())

    def get(self, index: np.ndarray) -> np.ndarray:
        return self.levels[-1][np.asarray(index, np.int64)]

    def set(self, index: np.ndarray, value: np.ndarray | float) -> None:
        """Set slots ``index`` to ``value`` and refresh their ancestors (repeats: last wins)."""
        idx = np.asarray(index, np.int64)
        if idx.size == 0:
            return
        values = np.asarray(value, np.float64)
        if np.any(values < 0) or not np.all(np.isfinite(values)):
            raise ValueError("priorities must be finite and >= 0")
        levels = self.levels
        levels[-1][idx] = values
        for i in range(len(levels) - 2, -1, -1):
            idx = idx >> 1
            child = levels[i + 1]
            left = idx << 1
            levels[i][idx] = child[left] + child[left + 1]

    def set_range(self, start: int, value: np.ndarray) -> None:
        """Set slots ``start .. start + len(value) - 1`` (no wrap) and refresh their ancestors.

        The same as :meth:`set` of those slots, in slices instead of index arrays: the
        ancestors of a run of slots are runs too, so each level is one strided add.
        """
        values = np.asarray(value, np.float64)
        n = len(values)
        if n == 0:
            return
        if start < 0 or start + n > self.capacity:
            raise ValueError(f"slots {start}..{start + n - 1} are outside 0..{self.capacity - 1}")
        if not (values.min() >= 0 and values.max() < np.inf):  # NaN fails both
            raise ValueError("priorities must be finite and >= 0")
        levels = self.levels
        levels[-1][start:start + n] = values
        lo, hi = start, start + n - 1
        for i in range(len(levels) - 2, -1, -1):
            lo, hi = lo >> 1, hi >> 1
            child = levels[i + 1]
            if lo == hi:  # one node: a scalar sum costs less than slicing
                levels[i][lo] = child[2 * lo] + child[2 * lo + 1]
            else:
                np.add(child[2 * lo:2 * hi + 2:2], child[2 * lo + 1:2 * hi + 2:2], out=levels[i][lo:hi + 1])

    def find(self, u: np.ndarray, csum: np.ndarray | None = None) -> np.ndarray:
        """Slots whose cumulative range holds each ``u`` in [0, total).

        Never returns a zero-priority slot while the total is positive: each
        step picks a child with a positive sum, and a ``u`` pushed past the
        end by rounding falls on the last positive node.
        """
        u = np.array(u, np.float64, copy=True)
        top = self.levels[0]
        csum = np.cumsum(top) if csum is None else csum
        node = np.searchsorted(csum, u, side="right")
        over = node >= len(top)
        if over.any():
            node[over] = int(np.flatnonzero(top > 0)[-1])
        u -= csum[node] - top[node]
        for child in self.levels[1:]:
            left = node << 1
            left_sum = child[left]
            go_right = (u >= left_sum) & (child[left + 1] > 0)
            u -= left_sum * go_right
            node = left + go_right
        return node

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
        """(``n`` slots drawn independently with probability priority / total, total)."""
        csum = np.cumsum(self.levels[0])
        total = float(csum[-1])
        if total <= 0:
            raise ValueError("cannot sample: every priority is zero")
        return self.find(rng.random(n) * total, csum), total

    def clear(self) -> None:
        for lvl in self.levels:
            lvl[:] = 0.0
