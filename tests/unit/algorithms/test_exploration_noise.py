"""Coloured exploration noise (``noise_color``): each draw N(0, 1), correlated in time as its colour
says, white exactly as before, and the policies of SAC and TD3 acting with it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from pydantic import ValidationError

from rlfleet.common.algorithms.noise import ExplorationNoise, powerlaw_noise
from rlfleet.common.algorithms.sac.config import SACConfig
from rlfleet.common.algorithms.sac.policy import SACPolicy
from rlfleet.common.algorithms.td3.config import TD3Config
from rlfleet.common.algorithms.td3.policy import TD3Policy

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)


def lag_one(x: np.ndarray) -> float:
    """Correlation of consecutive steps along the last axis."""
    return float(np.mean(x[..., 1:] * x[..., :-1]) / np.mean(x * x))


@pytest.mark.parametrize("length", [1000, 999, 64])
@pytest.mark.parametrize(("color", "low", "high"), [(0.0, -0.05, 0.05), (1.0, 0.55, 0.9), (2.0, 0.93, 1.0)])
def test_every_draw_is_standard_normal_and_the_colour_sets_the_correlation(
        color: float, low: float, high: float, length: int) -> None:
    x = powerlaw_noise(color, (2000, 1), length, np.random.default_rng(0))
    assert x.shape == (2000, 1, length)
    # unit variance at every step of the sequence, not only on average
    assert np.var(x[:, 0, 0]) == pytest.approx(1.0, abs=0.1)
    assert np.var(x[:, 0, length // 2]) == pytest.approx(1.0, abs=0.1)
    assert np.var(x) == pytest.approx(1.0, abs=0.03) and abs(np.mean(x)) < 0.05
    assert low <= lag_one(x) <= high


def test_white_noise_is_the_rngs_own_stream_and_coloured_noise_runs_on_past_a_sequence() -> None:
    white = ExplorationNoise(0.0, 1000, np.random.default_rng(3))
    np.testing.assert_array_equal(white((4, 2)), np.random.default_rng(3).standard_normal((4, 2)))
    pink = ExplorationNoise(1.0, 32, np.random.default_rng(3))
    draws = np.stack([pink((4, 2)) for _ in range(100)], axis=-1)  # three sequences and a part
    assert draws.shape == (4, 2, 100) and np.isfinite(draws).all()
    assert lag_one(draws) > 0.4
    assert not np.allclose(draws[..., :32], draws[..., 32:64])  # a new sequence, not the old one again
    for color, length, words in ((-1.0, 100, "noise color -1.0"), (1.0, 1, "noise length 1")):
        with pytest.raises(ValueError, match=words):
            ExplorationNoise(color, length, np.random.default_rng(0))


def test_configs_refuse_a_colour_outside_0_to_2() -> None:
    with pytest.raises(ValidationError, match="noise_color"):
        SACConfig(noise_color=3.0)
    with pytest.raises(ValidationError, match="noise_length"):
        TD3Config(noise_length=4)


@pytest.mark.parametrize("make", [
    lambda color: SACPolicy(SACConfig(hidden=[8], learning_starts=0, noise_color=color), OBS, ACTIONS, seed=0),
    lambda color: TD3Policy(TD3Config(hidden=[8], learning_starts=0, noise_color=color, exploration_noise=0.3),
                            OBS, ACTIONS, seed=0),
], ids=["sac", "td3"])
def test_policies_act_with_correlated_noise_when_coloured(make) -> None:  # type: ignore[no-untyped-def]
    obs = np.zeros((2, 3), np.float32)  # the same state each step: what varies is the noise
    walks = {}
    for color in (0.0, 1.0):
        policy = make(color)
        policy.explore(0, 1, 0)
        actions = np.stack([policy.act(obs)[0][:, 0] for _ in range(400)], axis=-1)
        assert ACTIONS.low[0] <= actions.min() and actions.max() <= ACTIONS.high[0]
        walks[color] = actions - actions.mean(axis=-1, keepdims=True)
        # the greedy action is the noise-free one whatever the colour
        np.testing.assert_array_equal(policy.act(obs, deterministic=True)[0], policy.act(obs, deterministic=True)[0])
    assert abs(lag_one(walks[0.0])) < 0.2
    assert lag_one(walks[1.0]) > 0.5
