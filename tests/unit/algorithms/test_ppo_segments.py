"""The PPO segment adder: exactly T steps per segment, the NEXT_STEP autoreset step dropped,
the bootstrap observation, truncation carrying its final observation, the version column."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from rlfleet.common.algorithms.adders.segments import SegmentAdder

OBS = gym.spaces.Box(-100, 100, (1,), np.float32)
EXTRAS = {"logp": ("float32", ()), "value": ("float32", ())}


def step(adder: SegmentAdder, action: int, next_obs: float, reward: float, version: int,
         term: bool = False, trunc: bool = False) -> dict[str, np.ndarray]:
    extras = {"logp": np.array([-0.5 - action], np.float32), "value": np.array([next_obs / 10], np.float32)}
    return adder.add(np.array([action]), extras, np.array([[next_obs]], np.float32), np.array([reward]),
                     np.array([term]), np.array([trunc]), None, version)


def test_segments_by_hand_next_step() -> None:
    adder = SegmentAdder(1, 3, OBS, gym.spaces.Discrete(2), extras=EXTRAS)
    adder.reset(np.array([[0.0]], np.float32))
    assert len(step(adder, 1, 1.0, 1.0, 0)["version"]) == 0
    assert len(step(adder, 0, 2.0, 2.0, 0, term=True)["version"]) == 0
    assert len(step(adder, 1, 10.0, 0.0, 1)["version"]) == 0  # the autoreset step: dropped, not counted
    seg = step(adder, 1, 11.0, 3.0, 2)
    assert len(seg["version"]) == 1
    np.testing.assert_array_equal(seg["obs"][0, :, 0], [0.0, 1.0, 10.0])
    np.testing.assert_array_equal(seg["action"][0], [1, 0, 1])
    np.testing.assert_array_equal(seg["reward"][0], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(seg["terminated"][0], [False, True, False])
    np.testing.assert_array_equal(seg["truncated"][0], [False, False, False])
    np.testing.assert_array_equal(seg["logp"][0], [-1.5, -0.5, -1.5])
    np.testing.assert_array_equal(seg["bootstrap_obs"][0], [11.0])
    assert seg["version"].tolist() == [0]  # the oldest step's version
    assert seg["obs"].shape == (1, 3, 1) and seg["bootstrap_obs"].shape == (1, 1)
    assert not seg["final_obs"].any()  # a termination does not bootstrap: nothing to carry

    assert len(step(adder, 0, 12.0, 4.0, 3)["version"]) == 0
    assert len(step(adder, 0, 13.0, 5.0, 3, trunc=True)["version"]) == 0  # truncated at 13
    assert len(step(adder, 1, 20.0, 0.0, 4)["version"]) == 0  # the autoreset step
    seg = step(adder, 1, 21.0, 6.0, 5)
    np.testing.assert_array_equal(seg["obs"][0, :, 0], [11.0, 12.0, 20.0])
    np.testing.assert_array_equal(seg["truncated"][0], [False, True, False])
    np.testing.assert_array_equal(seg["terminated"][0], [False, False, False])
    np.testing.assert_array_equal(seg["final_obs"][0, :, 0], [0.0, 13.0, 0.0])  # bootstrap from the final obs
    np.testing.assert_array_equal(seg["bootstrap_obs"][0], [21.0])
    assert seg["version"].tolist() == [3]
    assert adder.pending == 0


def test_truncation_at_segment_end_bootstraps_from_final_obs() -> None:
    adder = SegmentAdder(1, 2, OBS, gym.spaces.Discrete(2), extras=EXTRAS)
    adder.reset(np.array([[0.0]], np.float32))
    step(adder, 0, 1.0, 0.0, 0)
    seg = step(adder, 0, 2.0, 0.0, 0, trunc=True)
    np.testing.assert_array_equal(seg["bootstrap_obs"][0], [2.0])
    np.testing.assert_array_equal(seg["final_obs"][0, :, 0], [0.0, 2.0])


@pytest.mark.parametrize("mode,segments", [(AutoresetMode.NEXT_STEP, 30), (AutoresetMode.SAME_STEP, 36)])
def test_vector_env_segments(mode: AutoresetMode, segments: int) -> None:
    """Pendulum cut at 7 steps, 3 slots, 60 vector steps, T = 5. SAME_STEP: 180 env steps, 36
    segments. NEXT_STEP: one vector step per episode is the reset, 53 env steps a slot, 30 segments.
    Every 7th env step is a truncation carrying its final obs; raw (unclipped) actions are stored."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1", max_episode_steps=7)] * 3, autoreset_mode=mode)
    adder = SegmentAdder(3, 5, envs.single_observation_space, envs.single_action_space, mode, EXTRAS)
    obs, _ = envs.reset(seed=0)
    adder.reset(obs)
    rng, out = np.random.default_rng(0), []
    for _ in range(60):
        raw = rng.normal(size=(3, 1)).astype(np.float32) * 3
        obs, rewards, terminated, truncated, infos = envs.step(np.clip(raw, -2, 2))
        extras = {"raw_action": raw, "logp": np.zeros(3, np.float32), "value": np.zeros(3, np.float32)}
        out.append(adder.add(np.clip(raw, -2, 2), extras, obs, rewards, terminated, truncated, infos, 1))
    envs.close()
    batch = {key: np.concatenate([o[key] for o in out]) for key in out[0]}
    assert len(batch["version"]) == segments and batch["action"].shape == (segments, 5, 1)
    assert np.abs(batch["action"]).max() > 2  # raw samples beyond the bounds
    assert not batch["terminated"].any()
    truncated = batch["truncated"]
    assert truncated.sum() == pytest.approx(segments * 5 / 7, abs=3)
    final_norm = np.abs(batch["final_obs"]).sum(axis=2)
    assert (final_norm[truncated] > 0).all() and (final_norm[~truncated] == 0).all()
    # a truncation's final obs is a Pendulum observation: cos^2 + sin^2 = 1
    finals = batch["final_obs"][truncated]
    np.testing.assert_allclose(finals[:, 0] ** 2 + finals[:, 1] ** 2, 1.0, rtol=1e-5)


def test_refusals() -> None:
    with pytest.raises(ValueError, match="segment_length=0; allowed: >= 1"):
        SegmentAdder(1, 0, OBS, gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="not supported"):
        SegmentAdder(1, 2, OBS, gym.spaces.Discrete(2), AutoresetMode.DISABLED)
    adder = SegmentAdder(1, 2, OBS, gym.spaces.Discrete(2), extras=EXTRAS)
    with pytest.raises(RuntimeError, match="before reset"):
        step(adder, 0, 1.0, 0.0, 0)
