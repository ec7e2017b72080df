"""bench.fleet.faults reads its figures from the scrapes fairly: a fleet is not back before it steps again.

Scrapes are made up here (every 0.25 s, the bench's pace while a service is down and after it
answers again); the bench's own run is in docs/benchmarks.md.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from bench.fleet.faults import Rate, figures

EVERY_S = 0.25
KILLED, DOWN_S, UP = 100.0, 3.0, 103.5  # the restart took 0.5 s


def scraped(rates: list[tuple[float, float]], restarted: float | None = None, end: float = 110.0) -> Rate:
    """A Rate whose fleet made ``rate`` env steps/s from each ``(since, rate)`` on (the last that
    started); ``restarted``: actor-0's new process steps from then on (its counter starts at 0)."""
    rate = Rate(cast(Any, None))
    t, total, own = 90.0, 0.0, 0.0
    while t <= end:
        rate.points.append((t, total))
        rate.own.append((t, {"actor-0": own} if restarted is None or t >= UP else {}))
        now = [r for since, r in rates if since <= t][-1]
        total += now * EVERY_S
        if restarted is not None and t >= restarted:
            own += 500 * EVERY_S
        t += EVERY_S
    return rate


def test_a_fleet_back_at_once_is_back_at_the_next_scrape() -> None:
    rate = scraped([(0, 1000), (KILLED, 0), (UP, 1000)])  # steps from the health answer on
    got = figures(rate, 1000, KILLED, DOWN_S, UP, "replay-0")
    assert got["resumed_after_up_s"] == pytest.approx(0.25) and got["recovery_after_up_s"] == pytest.approx(0.25)
    assert got["recovery_s"] == pytest.approx(3.8) and got["restart_s"] == pytest.approx(0.5)
    assert got["lowest_while_down"] == 0.0


def test_a_stalled_start_does_not_count_as_back_even_when_the_stretch_averages_80_percent() -> None:
    # stalled for 0.5 s after the health answer, then twice as fast as before the kill: the 1 s
    # stretch from the answer averages 100%, but the fleet was not stepping for half of it
    rate = scraped([(0, 1000), (KILLED, 0), (UP + 0.5, 2000)])
    got = figures(rate, 1000, KILLED, DOWN_S, UP, "replay-0")
    assert rate.back_at(UP, 800) == UP
    assert got["resumed_after_up_s"] == pytest.approx(0.75)  # the first scrape showing steps
    assert got["recovery_after_up_s"] == pytest.approx(0.75)


def test_a_killed_actor_is_back_once_it_steps_itself() -> None:
    # one actor of two: the fleet never fell below 80% (the other took the cores), but the
    # restarted one steps only a second after answering
    rate = scraped([(0, 1000), (KILLED, 900)], restarted=UP + 1.0)
    got = figures(rate, 1000, KILLED, DOWN_S, UP, "actor-0")
    assert got["lowest_while_down"] == pytest.approx(0.9)
    assert got["resumed_after_up_s"] == pytest.approx(1.25)
    assert got["recovery_after_up_s"] == pytest.approx(1.25)


def test_a_fleet_that_stays_slow_never_recovers() -> None:
    rate = scraped([(0, 1000), (KILLED, 0), (UP, 500)])
    got = figures(rate, 1000, KILLED, DOWN_S, UP, "learner")
    assert got["resumed_after_up_s"] == pytest.approx(0.25)
    assert got["recovery_after_up_s"] is None and got["recovery_s"] is None
