"""DQN acting: Ape-X epsilons and beta, the epsilon schedule, epsilon-greedy actions, numpy and torch
Q-values alike, evaluation alike on every vector env."""

from __future__ import annotations

import numpy as np
import pytest

from harness.dqn_helpers import ACT_SPACE, OBS_SPACE
from rlfleet.common.algorithms.dqn.config import DQNConfig
from rlfleet.common.algorithms.dqn.learner import DQNLearner
from rlfleet.common.algorithms.dqn.policy import DQNPolicy, actor_epsilon, apex_epsilon
from rlfleet.common.algorithms.schedules import linear


def test_apex_epsilon_and_beta() -> None:
    assert apex_epsilon(0, 1, 0.4, 7.0) == 0.4
    assert apex_epsilon(0, 8, 0.4, 7.0) == pytest.approx(0.4)
    assert apex_epsilon(7, 8, 0.4, 7.0) == pytest.approx(0.4**8)
    assert apex_epsilon(2, 5, 0.4, 7.0) == pytest.approx(0.4**4.5)
    with pytest.raises(ValueError):
        apex_epsilon(3, 3, 0.4, 7.0)
    assert actor_epsilon(DQNConfig(epsilon=0.5, epsilon_alpha=3.0), 1, 2) == pytest.approx(0.5**4)
    assert linear(0.4, 1.0, 0, 100) == pytest.approx(0.4)
    assert linear(0.4, 1.0, 50, 100) == pytest.approx(0.7)
    assert linear(0.4, 1.0, 500, 100) == 1.0
    learner = DQNLearner(DQNConfig(beta_start=0.5, beta_updates=10), OBS_SPACE, ACT_SPACE, device="cpu")
    assert learner.importance_exponent() == 0.5 and learner.importance_exponent(5) == pytest.approx(0.75)
    # the learner weighs a batch with its exponent of when it learns: (N * P(i)) ** -beta over the batch max
    p = np.array([0.5, 0.25, 0.125, 0.125])
    expected = (8 * p) ** -0.5
    np.testing.assert_allclose(learner.weigh(p), expected / expected.max(), rtol=1e-6)
    learner.num_updates = 5
    expected = (8 * p) ** -0.75
    np.testing.assert_allclose(learner.weigh(p), expected / expected.max(), rtol=1e-6)
    np.testing.assert_array_equal(learner.weigh(np.full(4, 0.25)), np.ones(4, np.float32))  # uniform: exactly 1


def test_epsilon_schedule_over_fleet_steps() -> None:
    assert linear(1.0, 0.05, 0, None) == 0.05  # no schedule: the Ape-X value from the start
    assert linear(1.0, 0.05, 0, 1000) == 1.0
    assert linear(1.0, 0.05, 500, 1000) == pytest.approx(0.525)
    assert linear(1.0, 0.05, 1000, 1000) == 0.05
    assert linear(1.0, 0.05, 10**9, 1000) == 0.05
    cfg = DQNConfig(epsilon=0.4, epsilon_alpha=7.0, epsilon_decay_steps=10_000, epsilon_start=0.9)
    policy = DQNPolicy(cfg, OBS_SPACE, ACT_SPACE)
    assert policy.epsilon == 0.0  # greedy until explore() is called (evaluators never call it)
    for index in range(4):  # every actor starts at epsilon_start and ends at its own Ape-X value
        final = apex_epsilon(index, 4, 0.4, 7.0)
        assert policy.explore(index, 4, 0) == {"epsilon": pytest.approx(0.9)}
        assert policy.explore(index, 4, 5_000)["epsilon"] == pytest.approx((0.9 + final) / 2)
        assert policy.explore(index, 4, 20_000)["epsilon"] == pytest.approx(final)
        assert policy.epsilon == pytest.approx(final)


def test_epsilon_greedy_acting() -> None:
    policy = DQNPolicy(DQNConfig(hidden=[8]), OBS_SPACE, ACT_SPACE, act_seed=1)
    obs = np.random.default_rng(0).normal(size=(2000, 4)).astype(np.float32)
    greedy = policy.q_values(obs).argmax(axis=1)
    actions, extras = policy.act(obs)
    assert actions.dtype == np.int64 and actions.shape == (2000,) and extras == {}
    np.testing.assert_array_equal(actions, greedy)
    policy.epsilon = 1.0
    np.testing.assert_array_equal(policy.act(obs, deterministic=True)[0], greedy)
    random = policy.act(obs)[0]
    assert 0.4 < (random == greedy).mean() < 0.6  # uniform over 2 actions
    twins = [DQNPolicy(DQNConfig(hidden=[8]), OBS_SPACE, ACT_SPACE, act_seed=2) for _ in range(2)]
    for twin in twins:
        twin.epsilon = 0.5
    np.testing.assert_array_equal(twins[0].act(obs)[0], twins[1].act(obs)[0])  # the policy's own rng, seeded


@pytest.mark.parametrize("hidden,dueling", [([32, 16], True), ([16], False), ([], True)])
def test_numpy_q_values_match_torch(hidden: list[int], dueling: bool) -> None:
    """Few rows (acting) go through numpy, many through torch: the same Q-values either way."""
    from rlfleet.common.algorithms.dqn.policy import NUMPY_ROWS

    policy = DQNPolicy(DQNConfig(hidden=hidden, dueling=dueling), OBS_SPACE, ACT_SPACE, seed=5)
    obs = np.random.default_rng(2).normal(size=(NUMPY_ROWS + 1, 4)).astype(np.float32) * 3
    by_torch = policy.q_values(obs)  # above NUMPY_ROWS: torch
    by_numpy = np.concatenate([policy.q_values(obs[:NUMPY_ROWS]), policy.q_values(obs[NUMPY_ROWS:])])
    assert by_numpy.dtype == np.float32 and by_numpy.shape == (NUMPY_ROWS + 1, 2)
    np.testing.assert_allclose(by_numpy, by_torch, rtol=1e-5, atol=1e-5)
    assert np.abs(by_torch).max() > 1e-3  # not trivially zero


def test_evaluation_same_on_sync_async_and_reused_envs() -> None:
    from rlfleet.common import config as config_mod
    from rlfleet.common.evaluation import eval_envs, evaluate

    cfg = config_mod.load(data={"env": {"max_episode_steps": 60}, "algorithm": {"name": "dqn", "hidden": [16]}},
                          environ={})
    policy = DQNPolicy(cfg.algorithm, OBS_SPACE, ACT_SPACE, seed=1)
    fresh = evaluate(policy, cfg, 3, seed=7)
    assert fresh.shape == (3,) and (fresh > 0).all()
    for mode in ("async", "threads"):
        on = cfg.model_copy(update={"evaluator": cfg.evaluator.model_copy(update={"vectorization": mode})})
        envs = eval_envs(on, 3, seed=7)
        try:
            for _ in range(2):  # kept open across evaluations: every slot is reset with its seed each time
                np.testing.assert_array_equal(evaluate(policy, on, 3, seed=7, envs=envs), fresh)
        finally:
            envs.close()
