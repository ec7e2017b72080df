"""The algorithm registry and its env checks, and device selection."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import rlfleet.common.algorithms as algorithms
from harness.dqn_helpers import ACT_SPACE, OBS_SPACE
from rlfleet.common.algorithms.device import resolve_device
from rlfleet.common.algorithms.dqn import BUILDER
from rlfleet.common.algorithms.dqn.config import DQNConfig


def test_registry_and_env_checks() -> None:
    assert algorithms.get("dqn") is BUILDER
    assert "dqn" in algorithms.available()
    with pytest.raises(algorithms.UnknownAlgorithm, match="unknown algorithm 'nope'; available: a3c, dqn"):
        algorithms.get("nope")
    with pytest.raises(algorithms.UnknownAlgorithm):
        algorithms.get("device")  # a helper module, not an algorithm
    with pytest.raises(algorithms.UnknownAlgorithm):
        algorithms.get("adders")  # a helper folder, not an algorithm
    assert BUILDER.table_kinds == ("uniform", "prioritized")
    with pytest.raises(ValueError, match="already registered"):
        algorithms.register(
            algorithms.Builder("dqn", DQNConfig, BUILDER.check_env, BUILDER.make_adder, BUILDER.policy, BUILDER.learner)
        )
    cfg = DQNConfig()
    pendulum = gym.make("Pendulum-v1")
    with pytest.raises(
        algorithms.EnvMismatch, match=r"algorithm dqn needs a Discrete action space; env Pendulum-v1 has Box\("
    ):
        algorithms.check_env(cfg, pendulum.observation_space, pendulum.action_space, "Pendulum-v1")
    with pytest.raises(algorithms.EnvMismatch, match="Box observation space"):
        algorithms.check_env(cfg, gym.spaces.Discrete(5), gym.spaces.Discrete(2))
    with pytest.raises(algorithms.EnvMismatch, match="starting at 0"):
        algorithms.check_env(cfg, OBS_SPACE, gym.spaces.Discrete(2, start=1))
    algorithms.check_env(cfg, OBS_SPACE, ACT_SPACE, "CartPole-v1")
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
