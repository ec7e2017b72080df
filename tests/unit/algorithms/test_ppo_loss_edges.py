"""PPO's loss pieces at their edges: GAE over several segments at once, advantage normalisation of
two rows, of a near-constant batch and of the last short minibatch (what mutation testing found
unchecked: docs/testing.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet.common.algorithms.ppo.losses import (
    clipped_surrogate,
    gae,
    normalize_advantage,
    normalize_chunks,
    value_loss,
)


def test_gae_of_several_segments_is_each_segments_own() -> None:
    rng = np.random.default_rng(5)
    S, T = 3, 5
    rewards, values, next_values = rng.normal(size=(S, T)), rng.normal(size=(S, T)), rng.normal(size=(S, T))
    terminated = np.zeros((S, T), bool)
    terminated[1, 2] = True
    ended = terminated.copy()
    ended[2, 1] = True  # truncated
    rho = rng.uniform(0.2, 1.0, (S, T))
    for weights in (None, rho):
        adv, ret = gae(rewards, values, next_values, terminated, ended, 0.9, 0.8, weights)
        assert adv.shape == (S, T) and adv.dtype == np.float64
        for s in range(S):
            one = gae(rewards[s:s + 1], values[s:s + 1], next_values[s:s + 1], terminated[s:s + 1], ended[s:s + 1],
                      0.9, 0.8, None if weights is None else weights[s:s + 1])
            np.testing.assert_allclose(adv[s], one[0][0])
            np.testing.assert_allclose(ret[s], one[1][0])


def test_gae_takes_float32_inputs_at_float64() -> None:
    rewards = np.array([[1.0, 2.0]], np.float32)
    values = np.array([[0.1, 0.2]], np.float32)
    adv, ret = gae(rewards, values, np.zeros((1, 2), np.float32), np.zeros((1, 2), bool), np.zeros((1, 2), bool),
                   1.0, 1.0)
    assert adv.dtype == np.float64 and ret.dtype == np.float64
    np.testing.assert_allclose(adv, [[(1.0 - 0.1) + (2.0 - 0.2), 2.0 - 0.2]], rtol=1e-6)  # delta0 + delta1, delta1
    np.testing.assert_allclose(ret, adv + values.astype(np.float64))


def test_two_rows_are_normalised_and_one_is_left_alone() -> None:
    np.testing.assert_allclose(normalize_advantage(torch.tensor([1.0, 3.0])).numpy(), [-0.70710678, 0.70710678],
                               rtol=1e-6)
    assert normalize_advantage(torch.tensor([7.0])).item() == 7.0


def test_a_near_constant_batch_is_not_blown_up() -> None:
    """std + 1e-8: a spread of 1e-8 comes out at about 0.29, not at +-0.71 as dividing by the std alone would."""
    got = normalize_advantage(torch.tensor([0.0, 1e-8], dtype=torch.float64)).numpy()
    spread = np.std([0.0, 1e-8], ddof=1)
    np.testing.assert_allclose(got, np.array([-0.5e-8, 0.5e-8]) / (spread + 1e-8), rtol=1e-9)
    np.testing.assert_array_equal(normalize_advantage(torch.full((4,), 2.5)).numpy(), np.zeros(4))


def test_normalize_chunks_by_hand() -> None:
    adv = torch.tensor([1.0, 3.0, 10.0, 14.0, 5.0], dtype=torch.float64)
    r = 0.70710678118
    # chunks [1, 3] and [10, 14] each to -+0.707; the last row alone is left as is
    np.testing.assert_allclose(normalize_chunks(adv, 2).numpy(), [-r, r, -r, r, 5.0], rtol=1e-7)
    # one chunk of 4 and a last short chunk of 1; then no full chunk: the whole is one minibatch
    four = adv[:4]
    want = (four - four.mean()) / (four.std() + 1e-8)
    np.testing.assert_allclose(normalize_chunks(adv, 4).numpy(), [*want.numpy(), 5.0], rtol=1e-7)
    np.testing.assert_allclose(normalize_chunks(adv[:3], 4).numpy(), normalize_advantage(adv[:3]).numpy())
    # size 1: every minibatch is one row, left as is
    np.testing.assert_array_equal(normalize_chunks(adv, 1).numpy(), adv.numpy())
    # a spread of 1e-8 in a chunk is not blown up either
    tiny = normalize_chunks(torch.tensor([0.0, 1e-8, 0.0, 1e-8], dtype=torch.float64), 2).numpy()
    spread = np.std([0.0, 1e-8], ddof=1)
    np.testing.assert_allclose(tiny, np.array([-0.5e-8, 0.5e-8] * 2) / (spread + 1e-8), rtol=1e-9)


def test_the_surrogate_clips_a_ratio_only_against_the_advantage() -> None:
    """A ratio past 1 + clip with a negative advantage, or below 1 - clip with a positive one, is not clipped:
    the pessimistic bound keeps the unclipped term there."""
    ratio = torch.tensor([1.5, 0.5])
    adv = torch.tensor([-1.0, 1.0])
    assert clipped_surrogate(ratio, adv, 0.2).item() == pytest.approx((1.5 - 0.5) / 2)
    assert clipped_surrogate(torch.tensor([1.2]), torch.tensor([2.0]), 0.2).item() == pytest.approx(-2.4)


def test_value_clipping_keeps_the_larger_error() -> None:
    value, old, ret = torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.5])
    # V moved 1.0 from old, clipped to 0.2: (0.2 - 0.5)^2 = 0.09 < (1 - 0.5)^2 = 0.25: the unclipped one counts
    assert value_loss(value, old, ret, 0.2).item() == pytest.approx(0.25)
    # V moved -1.0, clipped to -0.2: (-0.2 - 0.5)^2 = 0.49 < (-1 - 0.5)^2 = 2.25: the unclipped one again
    assert value_loss(-value, old, ret, 0.2).item() == pytest.approx(2.25)
    # towards the return and past it: clipped (0.2 - 2)^2 = 3.24 beats unclipped (1 - 2)^2 = 1
    assert value_loss(value, old, torch.tensor([2.0]), 0.2).item() == pytest.approx(3.24)
    # downwards towards the return: clipped to 1 - 0.2, (0.8 - 0)^2 = 0.64 beats (0.5 - 0)^2 = 0.25
    assert value_loss(torch.tensor([0.5]), torch.tensor([1.0]), torch.tensor([0.0]), 0.2).item() == pytest.approx(0.64)
