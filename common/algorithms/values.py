"""What values the fleet's experience columns may hold, beyond their dtype and shape.

An adder's schema says each column's dtype and per-item shape; these rules say
what a column's values may be, so replay can refuse an insert that no actor of
the algorithm could have made (NaN observations, an Inf reward, a discount of
-5, action 2**62 on a 2-action env) before the learner trains on it:

- every float column is finite (observations, rewards, discounts, the extras a
  policy returns: log-probs, values, logits);
- ``discount`` (the n-step adder's) is in [0, 1];
- ``action`` is inside the env's action space where the stored action must be
  (a Discrete space: an int from its start to start + n - 1; a MultiDiscrete
  one: each dimension from its own start to start + nvec - 1). A Box action is
  only finite: algorithms may store the action before it is clipped or
  squashed into the bounds (PPO's Gaussian sample).

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
    """A column's allowed values: finite (floats), and within [low, high] where given.

    ``lows``/``highs`` (a MultiDiscrete action's): bounds per dimension of an item, in C order over its
    shape; ``low``/``high`` are then their smallest and largest, for a first look."""

    finite: bool = False
    low: float | None = None
    high: float | None = None
    lows: tuple[int, ...] | None = None
    highs: tuple[int, ...] | None = None

    def describe(self) -> str:
        if self.lows is not None and self.highs is not None:
            return (f"per dimension, values from {list(self.lows)} to {list(self.highs)}"
                    if len(self.lows) <= 16 else f"per dimension, values within {len(self.lows)} own bounds")
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
            if self.low <= low and high <= self.high and (self.lows is None or self._within(values)):
                return None
            if self.lows is not None and self.highs is not None and self.low <= low and high <= self.high:
                return self._dimension_problem(column, values)
            bad = low if not self.low <= low else high
        else:  # (no np.errstate here: entering it costs more than the sum; an overflow warns once)
            if not self.finite or math.isfinite(values.sum()) or np.isfinite(values).all():
                return None
            bad = values[~np.isfinite(values)].ravel()[0]
        return f"column {column!r} holds {bad}; allowed: {self.describe()}"

    def _actions(self, values: np.ndarray) -> np.ndarray | None:
        """``values`` as one row per action (its dimensions last, in C order: an item of a transition, or
        each step of a segment); None when they do not divide into actions of this many dimensions."""
        dims = len(self.lows or ())
        return values.reshape(-1, dims) if dims and values.size % dims == 0 else None

    def _within(self, values: np.ndarray) -> bool:
        """Every dimension of every action inside its own bounds."""
        per_item = self._actions(values)
        if per_item is None:
            return False
        return bool((per_item.min(axis=0) >= np.asarray(self.lows)).all()
                    and (per_item.max(axis=0) <= np.asarray(self.highs)).all())

    def _dimension_problem(self, column: str, values: np.ndarray) -> str:
        per_item = self._actions(values)
        lows, highs = np.asarray(self.lows), np.asarray(self.highs)
        if per_item is None:
            return f"column {column!r} holds no whole actions of {len(lows)} dimensions; allowed: {self.describe()}"
        bad = (per_item < lows) | (per_item > highs)
        row, dim = (int(i) for i in np.argwhere(bad)[0])
        return (f"column {column!r} holds {per_item[row, dim]} in dimension {dim}; allowed there: values from "
                f"{lows[dim]} to {highs[dim]} ({self.describe()})")


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
    if isinstance(space, spaces.MultiDiscrete):  # each dimension within its own nvec entry (and start)
        start = np.asarray(getattr(space, "start", np.zeros_like(space.nvec)), np.int64).ravel()
        high = start + np.asarray(space.nvec, np.int64).ravel() - 1
        return ValueRule(low=int(start.min()), high=int(high.max()), lows=tuple(int(v) for v in start),
                         highs=tuple(int(v) for v in high))
    return None
