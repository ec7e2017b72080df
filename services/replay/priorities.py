"""The priorities of prioritized replay.

Priorities must be finite, >= 0 and <= ``MAX_PRIORITY`` (1e12): a huge but
finite priority (1e308) would make the sum tree's total infinite and every
probability NaN. :func:`check_priorities` is what the server applies to
inserts and priority updates (reason ``bad_priority``). Importance weights are
the learner's (common/algorithms/importance.py), computed from the
probabilities a sample returns.
"""

from __future__ import annotations

import numpy as np

from rlfleet.services.replay.columnar import TableError

MAX_PRIORITY = 1e12


def check_priorities(priority: np.ndarray) -> None:
    """Refuse priorities that are not finite, negative or above MAX_PRIORITY (reason ``bad_priority``)."""
    p = np.asarray(priority)
    if p.size and not (p.min() >= 0 and p.max() <= MAX_PRIORITY):  # NaN fails both, +-inf one
        raise TableError("bad_priority", f"priorities must be finite, >= 0 and <= {MAX_PRIORITY:g}")

