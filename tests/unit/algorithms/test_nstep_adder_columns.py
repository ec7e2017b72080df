"""The n-step adder's columns have the dtypes and shapes its schema names (uint8 frames, Box actions),
for_env reads what a vector env says and refuses what it cannot store, and each refusal names the
setting (what mutation testing found unchecked: docs/testing.md)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlfleet.common.algorithms.adders.nstep import NStepAdder


def run_adder(adder: NStepAdder, actions: np.ndarray, steps: int = 4,
              env_dtype: type | None = None) -> dict[str, np.ndarray]:
    """``steps`` steps of one env slot ending in a truncation: every window is emitted. ``env_dtype``:
    the env's observations' dtype, when it is not the one the adder stores."""
    obs_shape, obs_dtype = adder.obs_shape, env_dtype or adder.obs_dtype
    adder.reset(np.zeros((1, *obs_shape), obs_dtype))
    out: dict[str, list[np.ndarray]] = {}
    for t in range(steps):
        cols = adder.add(actions, {}, np.full((1, *obs_shape), t + 1, obs_dtype), np.array([1.0]),
                         np.array([False]), np.array([t == steps - 1]), None, 3)
        for name, col in cols.items():
            out.setdefault(name, []).append(col)
    return {name: np.concatenate(cols) for name, cols in out.items()}


def assert_columns_match_schema(adder: NStepAdder, cols: dict[str, np.ndarray]) -> None:
    schema = adder.schema()
    assert set(cols) == set(schema)
    for name, (dtype, shape) in schema.items():
        assert cols[name].dtype == np.dtype(dtype), (name, cols[name].dtype, dtype)
        assert cols[name].shape[1:] == shape, (name, cols[name].shape, shape)


def test_frames_stay_uint8_and_discrete_actions_int64_in_every_column() -> None:
    adder = NStepAdder(1, 3, 0.5, (2, 2), obs_dtype=np.uint8)
    assert adder.schema() == {"obs": ("uint8", (2, 2)), "action": ("int64", ()), "reward": ("float32", ()),
                              "next_obs": ("uint8", (2, 2)), "discount": ("float32", ()), "version": ("int64", ())}
    cols = run_adder(adder, np.array([2]))
    assert_columns_match_schema(adder, cols)
    assert len(cols["obs"]) == 4 and (cols["action"] == 2).all() and (cols["version"] == 3).all()
    np.testing.assert_array_equal(cols["obs"][:, 0, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(cols["reward"], [1.75, 1.75, 1.5, 1.0])  # 1 + .5 + .25, truncated windows
    np.testing.assert_array_equal(cols["discount"], [0.125, 0.125, 0.25, 0.5])
    assert adder.gamma == 0.5 and adder.n_step == 3


def test_box_actions_are_stored_as_float32_vectors_and_float64_observations_as_float32() -> None:
    adder = NStepAdder(1, 2, 0.9, (3,), action_shape=(2,), action_dtype=np.float32)
    assert adder.schema()["action"] == ("float32", (2,))
    cols = run_adder(adder, np.array([[0.25, -0.5]]), env_dtype=np.float64)
    assert_columns_match_schema(adder, cols)
    np.testing.assert_array_equal(cols["action"], np.tile([0.25, -0.5], (4, 1)))
    np.testing.assert_array_equal(cols["next_obs"][:, 0], [2, 3, 4, 4])


def test_an_action_of_the_wrong_shape_is_refused_naming_both_shapes() -> None:
    adder = NStepAdder(2, 2, 0.9, (3,), action_shape=(2,), action_dtype=np.float32)
    adder.reset(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"^actions of shape \(2, 3\); this adder stores actions of shape \(2,\) "
                                         r"per env slot$"):
        adder.add(np.zeros((2, 3)), {}, np.zeros((2, 3), np.float32), np.zeros(2), np.zeros(2, bool),
                  np.zeros(2, bool), None, 0)


def test_n_step_below_one_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"^n_step=0; allowed: >= 1$"):
        NStepAdder(1, 0, 0.9, (1,))


class Words(gym.Env[str, np.int64]):
    observation_space = gym.spaces.Text(5)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[str, dict]:
        return "a", {}

    def step(self, action: np.int64) -> tuple[str, float, bool, bool, dict]:
        return "a", 0.0, False, False, {}


class Still(gym.Env[np.ndarray, np.int64]):
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        return np.zeros(3, np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(3, np.float32), 0.0, False, False, {}


def test_for_env_refuses_an_observation_space_without_a_shape() -> None:
    envs = SyncVectorEnv([Words])
    with pytest.raises(ValueError, match=r"^observation space Text\(1, 5, .*\) has no shape$"):
        NStepAdder.for_env(envs, 3, 0.9)
    envs.close()


def test_for_env_takes_next_step_where_the_env_does_not_say_its_autoreset_mode() -> None:
    envs = SyncVectorEnv([Still, Still], autoreset_mode=AutoresetMode.SAME_STEP)
    assert NStepAdder.for_env(envs, 3, 0.9).autoreset_mode is AutoresetMode.SAME_STEP
    envs.metadata = {k: v for k, v in envs.metadata.items() if k != "autoreset_mode"}
    adder = NStepAdder.for_env(envs, 3, 0.9)
    assert adder.autoreset_mode is AutoresetMode.NEXT_STEP and adder.obs_shape == (3,) and adder.n_step == 3
    envs.close()
