"""PPO's bad input is refused with the field, the value and what is allowed: the table kind,
segment length, minibatches, infinite action bounds, unknown options."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlfleet.common.algorithms as algorithms
from rlfleet.common import config as config_mod
from rlfleet.common.algorithms.ppo.config import PPOConfig

QUEUE = {"replay": {"tables": [{"name": "main", "kind": "queue"}]}}


def load(algorithm: dict[str, object], tables: dict[str, object] = QUEUE) -> config_mod.Experiment:
    return config_mod.load(data={"algorithm": {"name": "ppo", **algorithm}, **tables}, environ={})


def test_ppo_config_loads_on_a_queue() -> None:
    cfg = load({})
    assert isinstance(cfg.algorithm, PPOConfig) and cfg.algorithm.segment_length == 1024
    assert algorithms.get("ppo").table_kinds == ("queue",)


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_table_kind_refused(kind: str) -> None:
    with pytest.raises(config_mod.ConfigError, match=rf"replay.tables\[main\].kind='{kind}' with algorithm ppo;"
                       r" allowed: queue"):
        load({}, {"replay": {"tables": [{"name": "main", "kind": kind}]}})


def test_dqn_on_a_queue_refused() -> None:
    with pytest.raises(config_mod.ConfigError, match=r"kind='queue' with algorithm dqn; allowed: uniform, prioritized"):
        config_mod.load(data={"algorithm": {"name": "dqn"}, **QUEUE}, environ={})


@pytest.mark.parametrize("fields,words", [
    ({"segment_length": 0}, ["algorithm.segment_length", "0", "greater than or equal to 1"]),
    ({"segment_length": 100, "batch_segments": 3, "minibatch_size": 64},
     ["minibatch_size=64", "3 * 100 = 300", "allowed: a divisor"]),
    ({"anneal_lr": True}, ["anneal_env_steps=None", "allowed"]),
    ({"clip_rnge": 0.1}, ["algorithm.clip_rnge: unknown field", "clip_range", "segment_length"]),
])
def test_bad_fields_refused(fields: dict[str, object], words: list[str]) -> None:
    with pytest.raises(config_mod.ConfigError) as info:
        load(fields)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_barrier_round_must_split_into_minibatches() -> None:
    cfg = PPOConfig(segment_length=10, minibatch_size=64, batch_segments=32)
    assert cfg.check_fleet("barrier", 4, 8, 10) == []  # 4 * 8 * 10 = 320 = 5 x 64
    assert cfg.check_fleet("async", 1, 3, 7) == []  # async batches are batch_segments
    (problem,) = cfg.check_fleet("barrier", 1, 3, 10)
    assert "1 * 3 * 10 = 30 steps" in problem and "minibatch_size=64" in problem
    (problem,) = cfg.check_fleet("barrier", 4, 8, 15)
    assert "actor.steps_per_round=15 is not a multiple of algorithm.segment_length=10" in problem


def test_env_checks() -> None:
    cfg = PPOConfig()
    obs = gym.spaces.Box(-1, 1, (3,), np.float32)
    with pytest.raises(algorithms.EnvMismatch, match=r"env Odd-v0 has Box\(-inf, inf.*infinite bounds; allowed:"
                       r" Discrete \(starting at 0\), or Box with finite low and high"):
        algorithms.check_env(cfg, obs, gym.spaces.Box(-np.inf, np.inf, (1,), np.float32), "Odd-v0")
    with pytest.raises(algorithms.EnvMismatch, match=r"MultiDiscrete.*allowed: Discrete"):
        algorithms.check_env(cfg, obs, gym.spaces.MultiDiscrete([2, 2]), "Odd-v0")
    with pytest.raises(algorithms.EnvMismatch, match="Box observation space"):
        algorithms.check_env(cfg, gym.spaces.Discrete(3), gym.spaces.Discrete(2))
    pendulum = gym.make("Pendulum-v1")
    algorithms.check_env(cfg, pendulum.observation_space, pendulum.action_space, "Pendulum-v1")
