"""A sum tree over float64 priorities: vectorized batch updates and batch sampling.

Leaf ``i`` holds the (already alpha-scaled) priority of slot ``i``; every
inner node holds the sum of its two children, so the root is the total and
finding the leaf for a cumulative value takes one step per level. Both
:meth:`SumTree.set` and :meth:`SumTree.find` work on whole batches with numpy:
O(log n) per item, one vector operation per level for the whole batch.
"""

from __future__ import annotations

import numpy as np


class SumTree:
    """Priorities of ``capacity`` slots (leaves rounded up to a power of two)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.depth = self.leaves.bit_length() - 1
        # tree[1] is the root; node k has children 2k and 2k+1; leaves start at `leaves`.
        self.tree = np.zeros(2 * self.leaves, np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def get(self, index: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(index, np.int64) + self.leaves]

    def set(self, index: np.ndarray, value: np.ndarray | float) -> None:
        """Set leaves ``index`` to ``value`` and refresh their ancestors.

        Repeated indices are fine: every parent is recomputed from its current
        children, so duplicates write the same sum.
        """
        idx = np.asarray(index, np.int64) + self.leaves
        if idx.size == 0:
            return
        values = np.asarray(value, np.float64)
        if np.any(values < 0) or not np.all(np.isfinite(values)):
            raise ValueError("priorities must be finite and >= 0")
        self.tree[idx] = values
        tree = self.tree
        for _ in range(self.depth):
            idx = idx >> 1
            tree[idx] = tree[2 * idx] + tree[2 * idx + 1]

    def find(self, u: np.ndarray) -> np.ndarray:
        """Slots whose cumulative range holds each ``u`` in [0, total).

        Never returns a zero-priority slot while the total is positive: at
        each level it only goes right into a subtree with a positive sum,
        which also absorbs float rounding at the edges.
        """
        tree = self.tree
        u = np.array(u, np.float64, copy=True)
        idx = np.ones(u.shape, np.int64)
        for _ in range(self.depth):
            left = 2 * idx
            left_sum = tree[left]
            go_right = (u >= left_sum) & (tree[left + 1] > 0)
            u -= np.where(go_right, left_sum, 0.0)
            idx = left + go_right
        return idx - self.leaves

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` slots drawn independently with probability priority / total."""
        total = self.total
        if total <= 0:
            raise ValueError("cannot sample: every priority is zero")
        return self.find(rng.random(n) * total)

    def clear(self) -> None:
        self.tree[:] = 0.0
