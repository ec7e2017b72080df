"""The rate limiter's window as the module states it (centre, default width, edges), its diff, its
snapshot state, resume after a restart, and each refusal's message (what mutation testing found
unchecked: docs/testing.md)."""

from __future__ import annotations

import pytest

from rlfleet.services.replay.ratelimiter import RateLimiter, RateLimiterError


@pytest.mark.parametrize("spi, eb, lo, hi", [
    (1.0, 20.0, 0.0, 20.0),  # centred on spi * min_size = 10, 20 wide
    (4.0, 10.0, 35.0, 45.0),
    (0.5, None, 5.0 - 50.0, 5.0 + 50.0),  # default width: 100 x max(1, spi)
    (8.0, None, 80.0 - 400.0, 80.0 + 400.0),
])
def test_the_window_is_centred_on_spi_times_min_size(spi: float, eb: float | None, lo: float, hi: float) -> None:
    rl = RateLimiter(10, spi, eb)
    assert (rl.min_diff, rl.max_diff) == (lo, hi)
    assert rl.error_buffer == eb and rl.samples_per_insert == spi and rl.min_size == 10


def test_min_size_only_has_an_unbounded_window_and_a_zero_diff() -> None:
    rl = RateLimiter(3)
    rl.inserted(7)
    rl.sampled(2)
    assert (rl.min_diff, rl.max_diff, rl.diff) == (float("-inf"), float("inf"), 0.0)


def test_diff_is_inserts_times_spi_less_samples() -> None:
    rl = RateLimiter(1, 2.5, 10.0)
    rl.inserted(4)
    rl.inserted(2)
    rl.sampled(3)
    assert (rl.inserts, rl.samples, rl.diff) == (6, 3, 6 * 2.5 - 3)


def test_the_first_insert_that_reaches_min_size_is_judged_by_the_window() -> None:
    """size + 1 == min_size still fills the table: it goes whatever the ratio; size == min_size is judged."""
    rl = RateLimiter(10, 1.0, 2.0)  # diff must stay in [9, 11]
    rl.inserted(20)  # diff 20: far above the window
    assert rl.can_insert(8) and rl.can_insert(9)
    assert not rl.can_insert(10)


def test_a_sample_is_held_until_the_table_holds_min_size() -> None:
    rl = RateLimiter(10, 1.0, 20.0)
    rl.inserted(100)
    assert not rl.can_sample(9) and rl.can_sample(10)
    unlimited = RateLimiter(10)
    assert not unlimited.can_sample(9) and unlimited.can_sample(10)


def test_state_round_trips_and_a_missing_counter_is_zero() -> None:
    rl = RateLimiter(10, 1.0, 20.0)
    rl.inserted(12)
    rl.sampled(5)
    assert rl.state() == {"inserts": 12, "samples": 5}
    other = RateLimiter(10, 1.0, 20.0)
    other.restore(rl.state())
    assert (other.inserts, other.samples) == (12, 5)
    other.restore({"inserts": 3})
    assert (other.inserts, other.samples) == (3, 0)
    other.restore({"samples": 4})
    assert (other.inserts, other.samples) == (0, 4)
    other.restore({"inserts": "7", "samples": 2.0})  # a snapshot's numbers come back as ints
    assert (other.inserts, other.samples) == (7, 2) and type(other.inserts) is int and type(other.samples) is int


def test_resume_starts_from_the_windows_centre_when_samples_were_lost() -> None:
    rl = RateLimiter(10, 2.0, 40.0)  # centre: 20
    rl.restore({"inserts": 1000, "samples": 0})  # the samples since the snapshot are lost
    rl.resume()
    assert rl.samples == 1000 * 2 - 20 and rl.diff == 20.0
    assert rl.can_insert(1000) and rl.can_sample(1000)


def test_resume_keeps_samples_already_past_the_centre() -> None:
    rl = RateLimiter(10, 1.0, 20.0)
    rl.restore({"inserts": 100, "samples": 95})
    rl.resume()
    assert rl.samples == 95
    unlimited = RateLimiter(10)
    unlimited.restore({"inserts": 100, "samples": 0})
    unlimited.resume()
    assert unlimited.samples == 0


def test_refusals_name_the_setting_and_what_is_allowed() -> None:
    with pytest.raises(RateLimiterError, match=r"^min_size=0: allowed: >= 1$"):
        RateLimiter(0)
    with pytest.raises(RateLimiterError, match=r"^samples_per_insert=0\.0: allowed: > 0 or null$"):
        RateLimiter(10, 0.0, 10.0)
    with pytest.raises(RateLimiterError, match=r"^samples_per_insert=-1\.0: allowed: > 0 or null$"):
        RateLimiter(10, -1.0, 10.0)
    with pytest.raises(RateLimiterError) as e:
        RateLimiter(10, 4.0, 7.0)
    assert str(e.value) == (
        "error_buffer=7.0 is narrower than 2 x max(1, samples_per_insert) = 8.0: the limiter could block "
        "inserts and samples at the same time (deadlock); allowed: error_buffer >= 8.0")
    with pytest.raises(RateLimiterError, match=r"= 2\.0: .*allowed: error_buffer >= 2\.0$"):
        RateLimiter(10, 0.5, 1.5)  # below one sample per insert the floor is 2, not 2 x spi
    RateLimiter(10, 0.5, 2.0)
