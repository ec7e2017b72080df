"""What replay fixes a learner's table to (the algorithm's adder's schema, and the values its columns
may hold) is exactly what the actors' acting path inserts, for every shipped config: a drift between the
two would make replay refuse every real insert."""

from __future__ import annotations

import numpy as np
import pytest

from harness.fleet_helpers import CONFIGS
from rlfleet.common import algorithms, config
from rlfleet.common.envs import acting_policy, experience_spec, make_vector_env

SHIPPED = sorted(p.name for p in CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_the_declared_columns_are_what_actors_insert(name: str) -> None:
    short = ["algorithm.segment_length=8"] if "ppo" in name else []  # segments within 300 steps
    cfg = config.load(CONFIGS / name, sets=["env.num_envs=2", "env.vectorization=sync", *short], environ={})
    declared, rules = experience_spec(cfg)
    assert rules, "no value is checked"
    algo = algorithms.get(cfg.algorithm.name)
    envs = make_vector_env(cfg.env, 0, algo.autoreset_mode)
    try:
        policy = acting_policy(cfg, act_seed=0)
        adder = algo.make_adder(cfg.algorithm, 2, envs.single_observation_space, envs.single_action_space,
                                algo.autoreset_mode)
        obs, _ = envs.reset(seed=[0, 1])
        adder.reset(obs)
        seen = 0
        for _ in range(300):
            actions, extras = policy.act(obs)
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            items = adder.add(actions, extras, obs, rewards, terminated, truncated, infos, 0)
            n = len(next(iter(items.values()))) if items else 0
            if n:
                emitted = {k: (np.asarray(v).dtype.name, tuple(np.asarray(v).shape[1:])) for k, v in items.items()}
                assert emitted == declared
                for column, rule in rules.items():
                    assert rule.problem(column, np.asarray(items[column])) is None, column
                seen += n
            if seen >= 4:
                break
        assert seen >= 1, "the adder emitted nothing in 300 steps"
    finally:
        envs.close()


def test_a_table_restored_with_other_columns_is_not_silently_redeclared() -> None:
    from harness.replay_helpers import replay_config
    from rlfleet.services.replay.columnar import Table, TableError

    table = Table(replay_config().tables[0])
    table.declare({"obs": ("float32", (4,)), "version": ("int64", ())})
    table.declare({"obs": ("float32", (4,)), "version": ("int64", ())})  # the same: fine
    with pytest.raises(TableError, match=r"holds columns .*'obs': 'float32\[4\]'.* the algorithm emits .*float32\[8\]"):
        table.declare({"obs": ("float32", (8,)), "version": ("int64", ())})
