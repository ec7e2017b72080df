"""Priorities and importance weights of prioritized replay.

Priorities must be finite, >= 0 and <= ``MAX_PRIORITY`` (1e12): a huge but
finite priority (1e308) would make the sum tree's total infinite and every
probability and importance weight NaN. :func:`check_priorities` is what the
server applies to inserts and priority updates (reason ``bad_priority``).
Importance weights are computed here, by the server, once per sampled batch.
"""

from __future__ import annotations

import numpy as np

from services.replay.columnar import TableError

MAX_PRIORITY = 1e12


def check_priorities(priority: np.ndarray) -> None:
    """Refuse priorities that are not finite, negative or above MAX_PRIORITY (reason ``bad_priority``)."""
    p = np.asarray(priority)
    if p.size and not (p.min() >= 0 and p.max() <= MAX_PRIORITY):  # NaN fails both, +-inf one
        raise TableError("bad_priority", f"priorities must be finite, >= 0 and <= {MAX_PRIORITY:g}")


def importance_weights(prob: np.ndarray, size: int, beta: float | None) -> np.ndarray:
    """w_i = (N * P(i)) ** -beta, divided by the largest weight in the batch.

    Computed as ``(P(i) / min_j P(j)) ** -beta`` (N cancels), which is the same
    value but never overflows: every weight is in [0, 1], never NaN, even for
    tiny probabilities and beta up to 100.
    """
    if not beta or len(prob) == 0:
        return np.ones(len(prob), np.float32)
    p = np.asarray(prob, np.float64)
    lowest = p.min()
    if not lowest > 0:  # a probability that underflowed to 0: treat it as the smallest positive one
        p = np.maximum(p, np.finfo(np.float64).tiny)
        lowest = p.min()
    return ((p / lowest) ** (-beta)).astype(np.float32)
