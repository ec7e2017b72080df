"""The value rules replay applies to the algorithm's columns (common/algorithms/values.py)."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from rlfleet.common.algorithms.values import value_rules

SCHEMA = {"obs": ("float32", (2,)), "action": ("int64", (3,)), "discount": ("float32", ())}


def action_problem(space: spaces.Space, actions: list[list[int]]) -> str | None:  # type: ignore[type-arg]
    rule = value_rules(SCHEMA, space)["action"]
    return rule.problem("action", np.asarray(actions, np.int64))


def test_multidiscrete_actions_are_checked_per_dimension() -> None:
    space = spaces.MultiDiscrete([2, 5, 3])
    assert action_problem(space, [[0, 0, 0], [1, 4, 2]]) is None
    # 3 is inside the widest dimension's bound (0..4) but not dimension 0's (0..1): used to pass
    problem = action_problem(space, [[1, 4, 2], [3, 0, 0]])
    assert problem is not None and "column 'action'" in problem and "3 in dimension 0" in problem, problem
    assert "0 to 1" in problem, problem
    problem = action_problem(space, [[0, 0, 3]])
    assert problem is not None and "dimension 2" in problem and "0 to 2" in problem, problem
    problem = action_problem(space, [[0, 5, 0]])  # outside every dimension's bound
    assert problem is not None and "holds 5" in problem, problem
    problem = action_problem(space, [[0, -1, 0]])
    assert problem is not None and "holds -1" in problem, problem


def test_multidiscrete_with_a_start_per_dimension() -> None:
    space = spaces.MultiDiscrete([2, 2, 2], start=[-1, 0, 5])
    assert action_problem(space, [[-1, 1, 6], [0, 0, 5]]) is None
    problem = action_problem(space, [[1, 1, 6]])  # 1 is allowed in dimension 1 only
    assert problem is not None and "dimension 0" in problem and "-1 to 0" in problem, problem
    problem = action_problem(space, [[0, 0, 0]])  # 0 is below dimension 2's start
    assert problem is not None and "dimension 2" in problem and "5 to 6" in problem, problem


def test_discrete_and_float_rules_are_unchanged() -> None:
    rules = value_rules({"obs": ("float32", (2,)), "action": ("int64", ()), "discount": ("float32", ())},
                        spaces.Discrete(2))
    assert rules["action"].problem("action", np.array([0, 1])) is None
    assert rules["action"].problem("action", np.array([2])) is not None
    assert rules["discount"].problem("discount", np.array([1.5], np.float32)) is not None
    assert rules["obs"].problem("obs", np.array([[0.0, np.nan]], np.float32)) is not None


def test_multidiscrete_segments_are_checked_per_step_and_dimension() -> None:
    rule = value_rules({"action": ("int64", (4, 2))}, spaces.MultiDiscrete([2, 6]))["action"]
    segments = np.zeros((3, 4, 2), np.int64)  # 3 segments of 4 steps
    segments[..., 1] = 5
    assert rule.problem("action", segments) is None
    segments[2, 3, 0] = 2
    problem = rule.problem("action", segments)
    assert problem is not None and "2 in dimension 0" in problem, problem
