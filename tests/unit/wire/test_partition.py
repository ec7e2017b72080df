"""The shard partition: deterministic, order-independent, balanced by bytes."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.common.tensor_shards import Layout, fingerprint, partition, tensor_specs


def model() -> dict[str, np.ndarray]:
    return {"l1.w": np.zeros((256, 64), np.float32), "l1.b": np.zeros(256, np.float32),
            "l2.w": np.zeros((256, 256), np.float32), "l2.b": np.zeros(256, np.float32),
            "head.w": np.zeros((6, 256), np.float32), "head.b": np.zeros(6, np.float32),
            "count": np.zeros((), np.int64)}


def test_greedy_largest_first_and_order_independent() -> None:
    specs = tensor_specs(model())
    parts = partition(specs, 2)
    assert parts == partition(list(reversed(specs)), 2)
    assert parts[0] == ["l2.w"]  # the largest tensor alone outweighs the rest
    assert sorted(parts[0] + parts[1]) == sorted(model())
    reordered = dict(reversed(list(model().items())))
    assert Layout.of(reordered, 3) == Layout.of(model(), 3)


def test_balanced_when_sizes_allow() -> None:
    tensors = {f"t{i}": np.zeros(1000, np.float32) for i in range(8)}
    layout = Layout.of(tensors, 4)
    assert [layout.shard_nbytes(i) for i in range(4)] == [8000] * 4
    assert Layout.of(tensors, 1).shards == (tuple(sorted(tensors)),)


def test_fingerprint_names_layout_and_shard_count() -> None:
    specs = tensor_specs(model())
    assert fingerprint(specs, 2) != fingerprint(specs, 3)
    changed = {**model(), "head.b": np.zeros(7, np.float32)}
    assert fingerprint(tensor_specs(changed), 2) != fingerprint(specs, 2)
    as_float64 = {**model(), "head.b": np.zeros(6, np.float64)}
    assert fingerprint(tensor_specs(as_float64), 2) != fingerprint(specs, 2)


def test_check_shard_and_wire_round_trip() -> None:
    layout = Layout.of(model(), 2)
    assert Layout.from_wire(layout.to_wire(), 2) == layout
    assert layout.check_shard(0, layout.slice(model(), 0)) is None
    assert "lacks" in (layout.check_shard(1, {}) or "")
    stray = {**layout.slice(model(), 1), **layout.slice(model(), 0)}
    assert "does not belong" in (layout.check_shard(1, stray) or "")
    wrong = {n: np.zeros(3, np.float32) for n in layout.shards[1]}
    assert "layout says" in (layout.check_shard(1, wrong) or "")
    with pytest.raises(ValueError):
        Layout.from_wire([["x", "complex128", [2]]], 2)
    with pytest.raises(ValueError):
        Layout.from_wire([["x", "float32", [-1]]], 2)


def test_layout_hash_is_the_documented_bytes() -> None:
    """docs/protocol.md gives the exact bytes and hash of one layout: a client in another language
    checks itself against them."""
    import hashlib

    from rlfleet.common.tensor_shards import fingerprint

    blob = b'{"tensors":[["b","float32",[4]],["w","float32",[3,4]]],"num_shards":2}'
    assert fingerprint([("w", "float32", (3, 4)), ("b", "float32", (4,))], 2) == "a7345c4d053db377"
    assert hashlib.sha256(blob).hexdigest()[:16] == "a7345c4d053db377"
