"""The sum tree's layout as its docstring states it, positions that fall exactly on a boundary,
whole-number positions, and each refusal's message (what mutation testing found unchecked: docs/testing.md)."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.services.replay.sumtree import SumTree


@pytest.mark.parametrize("capacity", [1, 2, 3, 4, 5, 8, 9, 1000, 1024, 1025])
def test_leaves_are_the_capacity_padded_to_a_power_of_two(capacity: int) -> None:
    tree = SumTree(capacity, cut=3)
    leaves = 1 << (capacity - 1).bit_length()
    assert tree.levels[-1].shape == (leaves,)
    assert [lvl.size for lvl in tree.levels] == [leaves >> k for k in range(len(tree.levels) - 1, -1, -1)]


def test_only_the_bottom_cut_levels_are_kept_and_the_default_cut_is_8() -> None:
    tree = SumTree(1_000_000)  # 2**20 leaves: the top is 2**12 = 4,096 nodes (the module's docstring)
    assert len(tree.levels) == 8 + 1 and tree.levels[0].size == 4096
    assert len(SumTree(1000, cut=3).levels) == 3 + 1
    assert len(SumTree(5, cut=8).levels) == 3 + 1  # fewer levels than the cut: the whole tree


@pytest.mark.parametrize("cut", [1, 2, 8])
def test_a_position_on_a_boundary_belongs_to_the_slot_that_starts_there(cut: int) -> None:
    """Slot k holds [k, k + 1) when every priority is 1: u = k exactly is slot k, never k - 1."""
    tree = SumTree(16, cut=cut)
    tree.set(np.arange(16), np.ones(16))
    np.testing.assert_array_equal(tree.find(np.arange(16, dtype=np.float64)), np.arange(16))
    np.testing.assert_array_equal(tree.find(np.arange(16) + 0.5), np.arange(16))


def test_find_takes_whole_number_positions() -> None:
    tree = SumTree(8, cut=2)
    tree.set(np.arange(8), np.full(8, 2.0))
    np.testing.assert_array_equal(tree.find(np.array([0, 1, 2, 3, 15])), [0, 0, 1, 1, 7])


def test_set_refuses_a_negative_or_non_finite_priority_naming_the_rule() -> None:
    tree = SumTree(4)
    for bad in (-1.0, np.nan, np.inf):
        with pytest.raises(ValueError, match=r"^priorities must be finite and >= 0$"):
            tree.set(np.array([1]), np.array([bad]))
    assert tree.total == 0.0


def test_set_range_takes_zero_priorities_and_refuses_bad_ones_naming_the_rule() -> None:
    tree = SumTree(4)
    tree.set_range(0, np.array([1.0, 2.0, 3.0, 4.0]))
    tree.set_range(1, np.zeros(2))  # zero is a valid priority: the slot is never drawn
    assert tree.total == 5.0
    for bad in (-1.0, np.nan, np.inf):
        with pytest.raises(ValueError, match=r"^priorities must be finite and >= 0$"):
            tree.set_range(0, np.array([bad]))


def test_set_range_past_the_end_names_the_slots_and_the_valid_range() -> None:
    tree = SumTree(10)
    with pytest.raises(ValueError, match=r"^slots 9\.\.10 are outside 0\.\.9$"):
        tree.set_range(9, np.ones(2))


def test_a_capacity_below_one_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"^capacity must be >= 1, got 0$"):
        SumTree(0)


def test_sample_refuses_an_all_zero_tree_and_draws_from_a_small_total() -> None:
    tree = SumTree(4)
    with pytest.raises(ValueError, match=r"^cannot sample: every priority is zero$"):
        tree.sample(3, np.random.default_rng(0))
    tree.set(np.array([2]), np.array([0.25]))  # a total below 1 is still a total
    slots, total = tree.sample(5, np.random.default_rng(0))
    assert total == 0.25 and (slots == 2).all()
