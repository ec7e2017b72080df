"""Prioritized replay's importance weights, the learner's (common/algorithms/importance.py)."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.common.algorithms.importance import importance_weights


def test_the_formula_normalised_by_the_batch_maximum() -> None:
    rng = np.random.default_rng(0)
    priorities = np.arange(1, 17, dtype=np.float64)
    p = priorities / priorities.sum()  # a table of 16 items, alpha 1
    drawn = p[rng.choice(16, 64, p=p)]
    w = importance_weights(drawn, 0.4)
    assert w.dtype == np.float32 and w.shape == (64,)
    expected = (16 * drawn) ** -0.4  # N cancels: the table's size is not needed
    np.testing.assert_allclose(w, expected / expected.max(), rtol=1e-6)
    assert w.max() == pytest.approx(1.0)
    # the largest weight belongs to the least likely item in the batch
    assert w[np.argmin(drawn)] == pytest.approx(1.0)


@pytest.mark.parametrize("exponent", [0.0, None])
def test_no_exponent_gives_ones(exponent: float | None) -> None:
    p = np.array([0.1, 0.2, 0.7])
    w = importance_weights(p, exponent)
    assert w.dtype == np.float32
    np.testing.assert_array_equal(w, np.ones(3))


def test_equal_probabilities_give_exactly_one() -> None:
    """A uniform table's constant probabilities: weights of exactly 1, as learning unweighted."""
    for size in (3, 7, 1000, 123_457):
        w = importance_weights(np.full(256, 1.0 / size), 0.73)
        np.testing.assert_array_equal(w, np.ones(256, np.float32))


def test_an_empty_batch() -> None:
    w = importance_weights(np.zeros(0), 0.5)
    assert w.dtype == np.float32 and w.shape == (0,)


@pytest.mark.parametrize("exponent", [0.4, 1.0, 100.0])
def test_extreme_probabilities_give_finite_weights_in_0_1(exponent: float) -> None:
    """Tiny probabilities (and one that underflowed to 0) with exponents up to 100: never inf or NaN."""
    p = np.array([0.5, 1e-300, 0.0, 5e-324, 0.25, 1.0])
    w = importance_weights(p, exponent)
    assert np.all(np.isfinite(w)) and w.max() == 1.0 and w.min() >= 0
    # the underflowed probability counts as the smallest positive one: it gets the largest weight
    assert w[2] == 1.0


def test_it_needs_no_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; import rlfleet.common.algorithms.importance; "
            "assert 'torch' not in sys.modules, 'rlfleet.common.algorithms.importance imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)
