"""What values the fleet's experience columns may hold, beyond their dtype and shape.

An adder's schema says each column's dtype and per-item shape; these rules say
what a column's values may be, so replay can refuse an insert that no actor of
the algorithm could have made (NaN observations, an Inf reward, a discount of
-5, action 2**62 on a 2-action env) before the learner trains on it:

- every float column is finite (observations, rewards, discounts, the extras a
  policy returns: log-probs, values, logits);
- ``discount`` (the n-step adder's) is in [0, 1];
- ``action`` is inside the env's action space where the stored action must be
  (a Discrete or MultiDiscrete space: an int from its start to start + n - 1). A
  Box action is only finite: algorithms may store the action before it is
  clipped or squashed into the bounds (PPO's Gaussian sample).

numpy and gymnasium only: replay's image has no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces


@dataclass(frozen=True)
class ValueRule:
    """A column's allowed values: finite (floats), and within [low, high] where given."""

    finite: bool = False
    low: float | None = None
    high: float | None = None

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{'finite ' if self.finite else ''}values from {self.low:g} to {self.high:g}"
        return "finite values"

    def problem(self, column: str, values: np.ndarray) -> str | None:
        """What is wrong with ``values`` of ``column`` (None: nothing), naming a bad value and what is allowed.

        Per insert, so as few passes as can tell: a bounded column's min and max (a NaN fails both
        comparisons), an unbounded float column's sum (NaN or Inf if any value is, or if finite values
        overflow it, which the exact check then tells apart)."""
        if values.size == 0:
            return None
        if self.low is not None and self.high is not None:
            low, high = values.min(), values.max()
            if self.low <= low and high <= self.high:
                return None
            bad = low if not self.low <= low else high
        else:  # (no np.errstate here: entering it costs more than the sum; an overflow warns once)
            if not self.finite or math.isfinite(values.sum()) or np.isfinite(values).all():
                return None
            bad = values[~np.isfinite(values)].ravel()[0]
        return f"column {column!r} holds {bad}; allowed: {self.describe()}"


ValueRules = dict[str, ValueRule]


def value_rules(schema: Mapping[str, tuple[str, tuple[int, ...]]], action_space: Any) -> ValueRules:
    """The rules of every column of ``schema`` (an adder's) that has one, for actions of ``action_space``."""
    rules: ValueRules = {}
    for name, (dtype, _) in schema.items():
        if np.dtype(dtype).kind == "f":
            rules[name] = ValueRule(finite=True)
    if "discount" in rules:
        rules["discount"] = ValueRule(finite=True, low=0.0, high=1.0)
    action = _action_rule(action_space)
    if "action" in schema and action is not None and np.dtype(schema["action"][0]).kind in "iu":
        rules["action"] = action
    return rules


def _action_rule(space: Any) -> ValueRule | None:
    if isinstance(space, spaces.Discrete):
        return ValueRule(low=int(space.start), high=int(space.start) + int(space.n) - 1)
    if isinstance(space, spaces.MultiDiscrete):  # the same bound for each dimension: the widest one's
        start = np.asarray(getattr(space, "start", np.zeros_like(space.nvec)))
        return ValueRule(low=int(start.min()), high=int((start + space.nvec).max()) - 1)
    return None
