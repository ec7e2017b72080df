"""Prioritized replay's importance weights, computed by the learner from a batch's probabilities.

Replay returns each sampled item's probability ``P(i)`` (and the table's size ``N``); the
learner weights its loss by ``w_i = (N * P(i)) ** -exponent`` divided by the largest weight in
the batch, with its own exponent at learn time (as Acme's learners do). Replay knows no exponent.
Torch-free: numpy in, numpy out.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def importance_weights(probability: ArrayLike, exponent: float | None) -> np.ndarray:
    """float32 ``w_i = (N * P(i)) ** -exponent``, divided by the largest weight in the batch.

    Computed as ``(P(i) / min_j P(j)) ** -exponent`` (N cancels within a batch), which is the
    same value but never overflows: every weight is in [0, 1], never NaN, even for tiny
    probabilities and exponents up to 100. A probability that underflowed to 0 counts as the
    smallest positive float64. Equal probabilities (a uniform table) give exactly 1.
    ``exponent`` 0 or None (no correction), or an empty batch: all ones.
    """
    p = np.asarray(probability, np.float64).reshape(-1)
    if not exponent or len(p) == 0:
        return np.ones(len(p), np.float32)
    lowest = p.min()
    if not lowest > 0:  # a probability that underflowed to 0: treat it as the smallest positive one
        p = np.maximum(p, np.finfo(np.float64).tiny)
        lowest = p.min()
    return ((p / lowest) ** (-exponent)).astype(np.float32)
