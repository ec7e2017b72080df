"""`rlfleet up`'s restart policy: on-failure restarts, a crash loop and an exit 0 end the run."""

from __future__ import annotations

import pytest

from rlfleet.cli.supervision import RestartPolicy


def test_a_member_that_died_is_restarted_until_it_loops() -> None:
    policy = RestartPolicy("on-failure", limit=3, window_s=60.0)
    assert [policy.refusal("actor-0", -9, now=t) for t in (0.0, 1.0, 2.0)] == [None, None, None]
    assert policy.restarts("actor-0") == 3
    refusal = policy.refusal("actor-0", 1, now=3.0)
    assert refusal is not None and "4 times within 60 s" in refusal
    assert policy.refusal("learner", 1, now=3.0) is None  # counted per member


def test_deaths_older_than_the_window_are_forgotten() -> None:
    policy = RestartPolicy("on-failure", limit=2, window_s=10.0)
    assert policy.refusal("replay", 1, now=0.0) is None
    assert policy.refusal("replay", 1, now=5.0) is None
    assert policy.refusal("replay", 1, now=12.0) is None  # the death at 0 s is out of the window
    assert policy.refusal("replay", 1, now=13.0) is not None  # those at 5 and 12 s are not


def test_exit_zero_and_policy_no_end_the_run() -> None:
    assert "exited 0" in (RestartPolicy().refusal("evaluator", 0) or "")
    assert "restart policy 'no'" in (RestartPolicy("no").refusal("actor-1", -9) or "")
    with pytest.raises(ValueError, match="allowed: on-failure, no"):
        RestartPolicy("always")
