"""One barrier round's items in an order that does not depend on which actor's inserts reached
replay first.

A DPPO round is the same set of segments in every run with the same seeds (each actor's envs and
sampling are seeded by its index, and all act on version k), but the queue table hands them out
in arrival order, which the scheduler decides between actors. The learner's minibatch shuffle is
seeded, so the arrival order would pick which rows share a minibatch and so the weights. Sorting
the round by a digest of each item's contents gives every run the same order; items with equal
digests are equal, so their relative order cannot matter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

Columns = dict[str, np.ndarray]


def item_digests(data: Columns) -> list[bytes]:
    """A digest of every item (row) over all its columns, in column-name order."""
    names = sorted(data)
    count = len(data[names[0]])
    return [
        hashlib.blake2b(b"".join(np.ascontiguousarray(data[name][i]).tobytes() for name in names),
                        digest_size=16).digest()
        for i in range(count)
    ]


def concat_in_canonical_order(parts: Sequence[Columns]) -> Columns:
    """The batches of one round as one batch, items sorted by their digests."""
    data = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    digests = item_digests(data)
    order = np.array(sorted(range(len(digests)), key=digests.__getitem__), np.int64)
    return {k: v[order] for k, v in data.items()}
