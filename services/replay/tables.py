"""Replay table kinds: uniform, prioritized and queue selection over columnar storage.

Every kind stores its items in the ring of :class:`~rlfleet.services.replay.columnar.Table`
and differs in which keys a sample selects and what an insert may wait for.

- :class:`UniformTable`: ring buffer, oldest evicted, uniform sampling with
  replacement.
- :class:`PrioritizedTable`: ring buffer with a :class:`SumTree` over
  ``priority ** alpha``; sampling returns each item's probability (the
  learner derives its importance weights from them, as Acme's learners do).
- :class:`QueueTable`: FIFO; each item is sampled once and removed; inserts
  wait while it is full.

Whatever ``alpha`` is, the prioritized tree's leaves are clamped so their total
stays finite (priorities themselves are bounded by
:func:`~rlfleet.services.replay.priorities.check_priorities`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfleet.common.config import TableConfig
from rlfleet.services.replay.columnar import Table
from rlfleet.services.replay.prefault import lazy_zeros
from rlfleet.services.replay.sumtree import SumTree


class UniformTable(Table):
    kind = "uniform"

    def _select(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        offsets = self.rng.integers(0, self.size, batch_size, dtype=np.int64)
        keys = (np.uint64(self.oldest_key) + offsets.astype(np.uint64)).astype(np.uint64)
        return keys, np.full(batch_size, 1.0 / self.size)


class PrioritizedTable(Table):
    kind = "prioritized"

    def __init__(self, cfg: TableConfig, rng: np.random.Generator | None = None) -> None:
        super().__init__(cfg, rng)
        self.alpha = cfg.alpha
        self.tree = SumTree(cfg.capacity)
        self.priority = lazy_zeros((cfg.capacity,), np.float64)  # raw, before alpha
        self.max_priority = 1.0
        # largest leaf such that the sum of every leaf stays finite, whatever alpha is
        self.max_leaf = sys.float_info.max / (2 * len(self.tree.levels[-1]))

    def _leaf(self, p: np.ndarray) -> np.ndarray:
        """The sum tree's leaf of priorities ``p``: p ** alpha, clamped below the tree's cap."""
        if self.alpha == 1.0:
            leaf = p
        elif self.alpha < 1.0:  # priorities are <= MAX_PRIORITY: no overflow
            leaf = p ** self.alpha
        else:
            with np.errstate(over="ignore"):  # may overflow to inf: clamped just below
                leaf = p ** self.alpha
        return np.minimum(leaf, self.max_leaf)

    def _set(self, slots: np.ndarray, priority: np.ndarray) -> None:
        p = np.asarray(priority, np.float64)
        self.priority[slots] = p
        self.tree.set(slots, self._leaf(p))
        if p.size:
            self.max_priority = max(self.max_priority, float(p.max()))

    def _stored(self, first: int, n: int, priority: np.ndarray | None) -> None:
        # the slots of an insert are one run, or two where it wraps: slices, not index arrays
        p = np.full(n, self.max_priority) if priority is None else np.asarray(priority, np.float64)
        start = first % self.capacity
        head = min(n, self.capacity - start)
        for at, part in ((start, p[:head]), (0, p[head:])):
            if len(part):
                self.priority[at:at + len(part)] = part
                self.tree.set_range(at, self._leaf(part))
        if n:
            self.max_priority = max(self.max_priority, float(p.max()))

    def _select(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        try:
            slots, total = self.tree.sample(batch_size, self.rng)
        except ValueError:  # every priority is zero: fall back to uniform
            offsets = self.rng.integers(0, self.size, batch_size, dtype=np.int64)
            keys = np.uint64(self.oldest_key) + offsets.astype(np.uint64)
            return keys, np.full(batch_size, 1.0 / self.size)
        oldest_slot = self.oldest_key % self.capacity
        keys = np.uint64(self.oldest_key) + ((slots - oldest_slot) % self.capacity).astype(np.uint64)
        prob = self.tree.get(slots) / total
        return keys, prob

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        mask = self.present(keys)
        self.ignored_updates += int(len(keys) - mask.sum())
        if mask.any():
            self._set(self._slots(keys[mask]), priorities[mask])
        return int(mask.sum())

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta, arrays = super().state()
        keys = np.arange(self.oldest_key, self.next_key, dtype=np.uint64)
        arrays = {**arrays, "__priority__": self.priority[self._slots(keys)]}
        meta["max_priority"] = self.max_priority
        return meta, arrays

    def restore(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> int:
        self.tree.clear()
        self.priority[:] = 0.0
        self.max_priority = float(meta.get("max_priority", 1.0))
        return super().restore(meta, arrays)

    def _restored(self, slots: np.ndarray, arrays: Mapping[str, np.ndarray], skip: int) -> None:
        self._set(slots, arrays["__priority__"][skip:])


class QueueTable(Table):
    kind = "queue"
    stores_frames_once = False  # items leave by pops, in any number: each keeps its own stacks

    def can_insert(self, n: int) -> bool:
        return self.size + n <= self.capacity and self.limiter.can_insert(self.size)

    def _select(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        n = min(batch_size, self.size)
        keys = np.arange(self.oldest_key, self.oldest_key + n, dtype=np.uint64)
        self.size -= n  # each item is sampled once
        return keys, np.ones(n)


TABLES: dict[str, type[Table]] = {"uniform": UniformTable, "prioritized": PrioritizedTable, "queue": QueueTable}


def make_table(cfg: TableConfig, rng: np.random.Generator | None = None) -> Table:
    return TABLES[cfg.kind](cfg, rng)
