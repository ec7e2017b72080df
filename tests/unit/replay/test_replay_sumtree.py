"""Sum tree and table sampling against brute force, with statistical tests that a wrong tree fails."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.common.algorithms.importance import importance_weights
from rlfleet.common.config import TableConfig
from rlfleet.services.replay.columnar import TableError
from rlfleet.services.replay.sumtree import SumTree
from rlfleet.services.replay.tables import PrioritizedTable, QueueTable, UniformTable


def chi2_critical(df: int, z: float = 3.0902) -> float:
    """Chi-square quantile at p = 0.999 (Wilson-Hilferty): a correct tree fails 1 run in 1000,
    and the fixed seeds make every run the same."""
    return float(df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3)


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    n = counts.sum()
    expected = n * probs
    mask = expected > 0
    assert counts[~mask].sum() == 0, "sampled an item of probability zero"
    return float(((counts[mask] - expected[mask]) ** 2 / expected[mask]).sum())


def test_total_and_inner_sums_match_brute_force() -> None:
    rng = np.random.default_rng(0)
    tree = SumTree(37)
    p = rng.random(37)
    tree.set(np.arange(37), p)
    assert tree.total == pytest.approx(p.sum())
    for _ in range(50):  # batch updates with repeated indices
        idx = rng.integers(0, 37, 10)
        val = rng.random(10) * 5
        tree.set(idx, val)
        for i, v in zip(idx, val, strict=True):
            p[i] = v  # last write wins, as numpy assignment does
        assert tree.total == pytest.approx(p.sum())
        np.testing.assert_allclose(tree.get(np.arange(37)), p)
    # every node is the sum of its children
    for upper, lower in zip(tree.levels, tree.levels[1:], strict=False):
        np.testing.assert_allclose(upper, lower[0::2] + lower[1::2])


@pytest.mark.parametrize("capacity, cut", [(1, 6), (5, 1), (100, 3), (1000, 6), (40_000, 6), (40_000, 20)])
def test_shapes_and_brute_force_on_many_sizes(capacity: int, cut: int) -> None:
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity, cut)
    p = rng.random(capacity)
    p[1::5] = 0.0
    tree.set(np.arange(capacity), p)
    assert tree.total == pytest.approx(p.sum())
    u = rng.random(2000) * p.sum()
    got = tree.find(u)
    expected = np.searchsorted(np.cumsum(p), u, side="right")
    assert (got != expected).mean() < 1e-3 and (got < capacity).all() and (p[got] > 0).all()
    assert (p[tree.find(np.full(3, p.sum() * (1 + 1e-12)))] > 0).all()  # u past the end by rounding


def test_find_matches_cumulative_sum_exactly() -> None:
    rng = np.random.default_rng(1)
    p = rng.random(100)
    p[::7] = 0.0
    tree = SumTree(100)
    tree.set(np.arange(100), p)
    u = rng.random(5000) * p.sum()
    expected = np.searchsorted(np.cumsum(p), u, side="right")
    got = tree.find(u)
    assert np.all(p[got] > 0)
    # identical except where u lies within float rounding of a boundary
    assert (got != expected).mean() < 1e-3


@pytest.mark.parametrize("capacity", [20, 50])
def test_sampling_distribution_chi_square(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    p = rng.random(capacity) ** 2
    p[3] = 0.0
    tree.set(np.arange(capacity), p)
    draws, _ = tree.sample(200_000, np.random.default_rng(42))
    counts = np.bincount(draws, minlength=capacity)
    probs = p / p.sum()
    df = int((probs > 0).sum()) - 1
    stat = chi_square(counts, probs)
    assert stat < chi2_critical(df), f"chi2={stat:.1f} >= {chi2_critical(df):.1f} (df={df})"
    # the same test rejects a slightly wrong distribution: it has the power to fail
    wrong = p.copy()
    wrong[0] *= 1.3
    assert chi_square(counts, wrong / wrong.sum()) > chi2_critical(df)


def table(kind: str, capacity: int = 30, alpha: float = 0.6) -> PrioritizedTable | UniformTable | QueueTable:
    cfg = TableConfig(name="t", kind=kind, capacity=capacity, alpha=alpha, min_size=1)
    cls = {"prioritized": PrioritizedTable, "uniform": UniformTable, "queue": QueueTable}[kind]
    return cls(cfg, np.random.default_rng(7))  # type: ignore[return-value]


def batch(n: int, start: int = 0) -> dict[str, np.ndarray]:
    return {"obs": (np.ones((n, 4)) * np.arange(start, start + n)[:, None]).astype(np.float32),
            "idx": np.arange(start, start + n, dtype=np.int64)}


def test_prioritized_table_distribution_with_alpha_after_updates_and_eviction() -> None:
    t = table("prioritized", capacity=30, alpha=0.7)
    t.insert(batch(20), np.ones(20))
    t.insert(batch(20, 20), np.ones(20))  # 10 evicted: keys 10..39 remain
    assert t.size == 30 and t.oldest_key == 10
    rng = np.random.default_rng(3)
    keys = np.arange(0, 40, dtype=np.uint64)
    prio = rng.random(40) * 3
    updated = t.update_priorities(keys, prio)
    assert updated == 30 and t.ignored_updates == 10  # keys 0..9 were evicted
    want = prio[10:] ** 0.7
    want = want / want.sum()
    counts = np.zeros(30)
    for _ in range(100):
        s = t.sample(1000)
        np.testing.assert_array_equal(s.data["idx"], s.keys.astype(np.int64))  # keys name their data
        np.testing.assert_allclose(s.probability, want[s.keys.astype(np.int64) - 10])
        counts += np.bincount(s.keys.astype(np.int64) - 10, minlength=30)
    assert chi_square(counts, want) < chi2_critical(29)


def test_probabilities_give_the_learners_importance_weights() -> None:
    """The table returns P(i); the learner's weights from them are (N * P(i)) ** -beta over the batch max."""
    t = table("prioritized", capacity=16, alpha=1.0)
    t.insert(batch(16), np.arange(1, 17, dtype=np.float64))
    s = t.sample(64)
    assert not hasattr(s, "weight")  # replay computes no weights
    p = (s.keys.astype(np.float64) + 1) / np.arange(1, 17).sum()
    np.testing.assert_allclose(s.probability, p)
    w = (16 * p) ** -0.4
    learner_weights = importance_weights(s.probability, 0.4)
    np.testing.assert_allclose(learner_weights, w / w.max(), rtol=1e-6)
    assert learner_weights.max() == pytest.approx(1.0)
    # the largest weight belongs to the least likely item in the batch
    assert learner_weights[np.argmin(s.probability)] == pytest.approx(1.0)


def test_uniform_and_queue_tables() -> None:
    u = table("uniform", capacity=10)
    u.insert(batch(10))
    u.insert(batch(10, 10))
    u.insert(batch(5, 20))
    s = u.sample(500)
    assert set(s.keys.tolist()) == set(range(15, 25))
    np.testing.assert_array_equal(s.data["idx"], s.keys.astype(np.int64))
    np.testing.assert_allclose(s.probability, 0.1)
    q = table("queue", capacity=10)
    assert q.can_insert(10) and not q.can_insert(11)
    q.insert(batch(8))
    assert not q.can_insert(3)
    s = q.sample(5)
    assert s.keys.tolist() == [0, 1, 2, 3, 4] and q.size == 3
    s = q.sample(5)
    assert s.keys.tolist() == [5, 6, 7] and q.size == 0  # each item once
    assert not q.can_sample()


@pytest.mark.parametrize("bad, word", [
    ({"obs": np.zeros((2, 4), np.float64), "idx": np.zeros(2, np.int64)}, "'obs' has dtype float64"),
    ({"obs": np.zeros((2, 5), np.float32), "idx": np.zeros(2, np.int64)}, "'obs' has per-item shape [5]"),
    ({"obs": np.zeros((2, 4), np.float32)}, "'idx' is missing"),
    ({"obs": np.zeros((2, 4), np.float32), "idx": np.zeros(2, np.int64), "x": np.zeros(2)}, "'x' is unknown"),
])
def test_schema_mismatch_names_the_field(bad: dict[str, np.ndarray], word: str) -> None:
    t = table("uniform")
    t.insert(batch(3))
    with pytest.raises(TableError) as e:
        t.check(bad)
    assert e.value.reason == "schema_mismatch" and word in e.value.detail


def test_snapshot_state_round_trip() -> None:
    t = table("prioritized", capacity=30)
    p = np.linspace(0.1, 4, 45)
    t.insert(batch(25), p[:25])
    t.insert(batch(20, 25), p[25:])
    t.sample(10)
    meta, arrays = t.state()
    r = table("prioritized", capacity=30)
    assert r.restore(meta, arrays) == 30
    for a, b in zip(r.tree.levels, t.tree.levels, strict=True):
        np.testing.assert_allclose(a, b)
    assert (r.next_key, r.size, r.limiter.samples) == (45, 30, 10)
    for name in t.columns:
        np.testing.assert_array_equal(r.columns[name], t.columns[name])


@pytest.mark.parametrize("capacity", [1, 2, 37, 1000, 5000])
def test_set_range_is_set_of_those_slots(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    by_range, by_index = SumTree(capacity, cut=3), SumTree(capacity, cut=3)
    for _ in range(40):
        start = int(rng.integers(0, capacity))
        n = int(rng.integers(0, capacity - start + 1))
        val = rng.random(n) * 10
        by_range.set_range(start, val)
        by_index.set(np.arange(start, start + n), val)
        for a, b in zip(by_range.levels, by_index.levels, strict=True):
            np.testing.assert_array_equal(a, b)  # every inner sum, not only the total
    with pytest.raises(ValueError):
        by_range.set_range(capacity - 1, np.ones(2))
    for bad in (np.nan, np.inf, -1.0):
        with pytest.raises(ValueError):
            by_range.set_range(0, np.array([bad]))
