"""How a learner consumes one barrier round (``sync: barrier``), as its :class:`DataSpec` asks.

Round k is every live actor's ``actor.steps_per_round`` vector steps on weights version k; the
learner then does what the round object says and publishes k + 1:

- :class:`Round` of kind ``"updates"``: ``updates_per_round`` learn calls, each on a fresh batch of
  ``batch_items`` (off-policy algorithms: the round fixes the ratio of learning to acting).
- kind ``"every_item"``: every item the round's actors inserted, each exactly once, in one learn
  call (on-policy algorithms: one item covers ``item_steps`` env steps of one env slot, so the round
  holds ``envs * steps_per_round / item_steps`` items).

The learner service and the serial runner both run it; only the service needs timeouts (a replay that
restarts mid-round), so :meth:`Round.run` is the in-process loop and the service drives the same
counts (:attr:`Round.learn_calls`, :attr:`Round.items`, :meth:`Round.requests`) with its deadlines.

One round's items are learnt in an order arrival does not decide (:func:`concat_in_canonical_order`):
a round is the same set of items in every run with the same seeds (each actor's envs and sampling
are seeded by its index, and all act on version k), but a queue hands them out in arrival order,
which the scheduler decides between actors. The learner's minibatch shuffle is seeded, so the
arrival order would pick which rows share a minibatch and so the weights. Sorting by a digest of
each item's contents gives every run the same order; items with equal digests are equal, so their
relative order cannot matter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rlfleet.common.algorithms.contract import Columns, DataSpec


@dataclass(frozen=True)
class Round:
    kind: Literal["updates", "every_item"]
    learn_calls: int  # updates: one per batch; every_item: 1
    items: int  # items the round consumes in all
    batch_items: int  # items per sample request

    def requests(self) -> int:
        """Sample requests the round needs (the last may be short)."""
        return -(-self.items // self.batch_items)

    def run(self, sample: Callable[[int], Any], learn: Callable[[Any], None]) -> None:
        """The round in one process: ``sample(n)`` returns a batch of (up to) n items, with its data in
        ``.data`` for every_item rounds; ``learn(batch)`` trains on one."""
        if self.kind == "updates":
            for _ in range(self.learn_calls):
                learn(sample(self.batch_items))
            return
        parts, got = [], 0
        while got < self.items:
            batch = sample(min(self.batch_items, self.items - got))
            n = len(batch.data["version"])
            if n == 0:
                break
            parts.append(batch.data)
            got += n
        if parts:
            learn(concat_in_canonical_order(parts))


def round_of(data: DataSpec, updates_per_round: int, envs: int, steps_per_round: int) -> Round:
    """The round of a fleet of ``envs`` env slots in all (live actors x env.num_envs) acting
    ``steps_per_round`` vector steps each, for a learner that consumes data as ``data`` says."""
    if data.round == "updates":
        return Round("updates", updates_per_round, updates_per_round * data.batch_items, data.batch_items)
    return Round("every_item", 1, envs * steps_per_round // data.item_steps, data.batch_items)


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
