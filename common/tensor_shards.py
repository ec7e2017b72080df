"""How a model's tensors are split across parameter-server shards.

Shared by the learner (publisher) and the actors (readers): both compute the
same partition from the same (name, dtype, shape) list, so neither needs to
ask the other. The partition is balanced by bytes (greedy, largest tensor
first onto the lightest shard) and depends only on the *set* of tensors and
the shard count, never on dict order or on the host: ties break by name, then
by the lowest shard index.

The layout fingerprint names one partition: a hash of the sorted
(name, dtype, shape) list and the shard count. It travels in ``publish`` and
``weights`` as ``layout`` so a reader can refuse to assemble tensors from two
different models.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet.common.wire.codec import wire_dtype_name

#: (name, wire dtype name, shape) of one tensor
TensorSpec = tuple[str, str, tuple[int, ...]]


def tensor_specs(tensors: Mapping[str, Any]) -> list[TensorSpec]:
    """The (name, dtype, shape) of each array, sorted by name."""
    out = []
    for name, arr in tensors.items():
        a = np.asarray(arr) if not isinstance(arr, np.ndarray) else arr
        out.append((str(name), wire_dtype_name(a.dtype), tuple(int(d) for d in a.shape)))
    return sorted(out)


def spec_nbytes(spec: TensorSpec) -> int:
    return math.prod(spec[2]) * np.dtype(spec[1]).itemsize


def partition(specs: Iterable[TensorSpec], num_shards: int) -> list[list[str]]:
    """Tensor names per shard, balanced by bytes: largest first onto the lightest shard.

    Deterministic for a given set of specs: ties between equal sizes break by
    name, ties between equally loaded shards by the lowest index. Each shard's
    names come back sorted. A shard may be empty when there are fewer tensors
    than shards.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    items = sorted(specs, key=lambda s: (-spec_nbytes(s), s[0]))
    names = [s[0] for s in items]
    if len(set(names)) != len(names):
        raise ValueError("tensor names must be unique")
    loads = [0] * num_shards
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    for spec in items:
        target = min(range(num_shards), key=lambda i: (loads[i], i))
        shards[target].append(spec[0])
        loads[target] += spec_nbytes(spec)
    return [sorted(s) for s in shards]


def fingerprint(specs: Iterable[TensorSpec], num_shards: int) -> str:
    """A short hash naming the layout: sorted (name, dtype, shape) and the shard count."""
    canon = [[n, d, list(s)] for n, d, s in sorted(specs)]
    blob = json.dumps({"tensors": canon, "num_shards": num_shards}, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Layout:
    """One model split across ``num_shards`` shards."""

    specs: tuple[TensorSpec, ...]
    num_shards: int
    shards: tuple[tuple[str, ...], ...]
    fingerprint: str

    @classmethod
    def from_specs(cls, specs: Iterable[TensorSpec], num_shards: int) -> Layout:
        ordered = tuple(sorted((str(n), str(d), tuple(int(x) for x in s)) for n, d, s in specs))
        parts = partition(ordered, num_shards)
        return cls(ordered, num_shards, tuple(tuple(p) for p in parts), fingerprint(ordered, num_shards))

    @classmethod
    def of(cls, tensors: Mapping[str, Any], num_shards: int) -> Layout:
        return cls.from_specs(tensor_specs(tensors), num_shards)

    @property
    def spec_by_name(self) -> dict[str, TensorSpec]:
        return {s[0]: s for s in self.specs}

    def shard_specs(self, shard: int) -> list[TensorSpec]:
        by_name = self.spec_by_name
        return [by_name[n] for n in self.shards[shard]]

    def shard_nbytes(self, shard: int) -> int:
        return sum(spec_nbytes(s) for s in self.shard_specs(shard))

    def slice(self, tensors: Mapping[str, Any], shard: int) -> dict[str, Any]:
        """The tensors that live on ``shard`` (same objects, no copy)."""
        return {n: tensors[n] for n in self.shards[shard]}

    def check_shard(self, shard: int, arrays: Mapping[str, np.ndarray]) -> str | None:
        """Why ``arrays`` is not exactly this shard's slice, or None when it is."""
        want = {s[0]: s for s in self.shard_specs(shard)}
        got = {s[0]: s for s in tensor_specs(arrays)}
        missing = sorted(set(want) - set(got))
        if missing:
            return f"shard {shard} slice lacks tensor {missing[0]!r} ({len(missing)} missing)"
        extra = sorted(set(got) - set(want))
        if extra:
            return f"tensor {extra[0]!r} does not belong on shard {shard} under layout {self.fingerprint}"
        for name, spec in want.items():
            if got[name] != spec:
                return (f"tensor {name!r} is {got[name][1]}{list(got[name][2])}; the layout says "
                        f"{spec[1]}{list(spec[2])}")
        return None

    def to_wire(self) -> list[list[Any]]:
        """The ``tensors`` field of ``publish``: [[name, dtype, shape], ...] sorted by name."""
        return [[n, d, list(s)] for n, d, s in self.specs]

    @classmethod
    def from_wire(cls, items: Sequence[Any], num_shards: int) -> Layout:
        """Parse a ``tensors`` field; raises ValueError with the reason."""
        specs = []
        for item in items:
            if not (isinstance(item, list) and len(item) == 3):
                raise ValueError("each tensors item must be [name, dtype, shape]")
            name, dtype, shape = item
            if not isinstance(name, str) or not name or not isinstance(dtype, str):
                raise ValueError("tensor name and dtype must be non-empty strings")
            try:
                dtype = wire_dtype_name(np.dtype(dtype))
            except Exception:
                raise ValueError(f"tensor {name!r}: dtype {dtype!r} is not allowed") from None
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape
            ):
                raise ValueError(f"tensor {name!r}: shape must be a list of non-negative ints")
            specs.append((name, dtype, tuple(shape)))
        if not specs:
            raise ValueError("a layout needs at least one tensor")
        return cls.from_specs(specs, num_shards)
