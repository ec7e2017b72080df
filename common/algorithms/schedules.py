"""Schedules: one style for every knob that moves during training.

Ape-X's epsilon (over the fleet's env steps), prioritized replay's importance exponent (over
updates) and PPO's annealed learning rate and clip (over the env steps trained on) are all the
same line: from ``start`` at 0 to ``end`` at ``duration``, then held.
"""

from __future__ import annotations


def linear(start: float, end: float, t: float, duration: float | None) -> float:
    """``start`` at ``t`` = 0, ``end`` from ``t`` = ``duration`` on, linear between; ``duration`` None
    or 0: ``end`` throughout."""
    if not duration or t >= duration:
        return float(end)
    return float(start + (end - start) * max(0.0, t) / duration)
