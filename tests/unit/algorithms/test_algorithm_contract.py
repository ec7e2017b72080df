"""Every registered algorithm keeps the contract: act -> adder -> learn on tiny envs, the version
column, repeatable deterministic acting; and drop_stale."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rlfleet.common.algorithms as algorithms
from harness.toy_envs import Reach
from rlfleet.common.algorithms import drop_stale

# Tiny settings for every algorithm, each applied where its config has the field: a new algorithm is
# covered without an entry here (adding one touches its folder, its config file and the registry only).
SMALL: dict[str, Any] = {"hidden": [8], "batch_size": 8, "learning_starts": 0, "segment_length": 4,
                         "batch_segments": 2, "minibatch_size": 4, "epochs": 2, "n_steps": 4, "hogwild_start": 8}
# what makes an algorithm that can train either way train through gradient workers (where the field exists)
WITH_WORKERS: dict[str, Any] = {"hogwild": True}
TINY_ENVS = ("CartPole-v1", "reach")  # discrete and continuous actions


def make(env: str) -> gym.Env:
    return Reach() if env == "reach" else gym.make(env)


def small(algo: algorithms.Builder, **settings: Any) -> Any:
    fields = algo.config.model_fields
    return algo.config(**{k: v for k, v in {**SMALL, **settings}.items() if k in fields})


def fits(algo: algorithms.Builder, env_id: str) -> bool:
    env = make(env_id)
    try:
        algo.check_env(small(algo), env.observation_space, env.action_space, env_id)
    except algorithms.EnvMismatch:
        return False
    return True


ENVS = [(name, env) for name in algorithms.available() for env in TINY_ENVS
        if algorithms.get(name).learner is not None and fits(algorithms.get(name), env)]
WORKER_ENVS = [(name, env, {k: v for k, v in WITH_WORKERS.items() if k in algorithms.get(name).config.model_fields})
               for name in algorithms.available() for env in TINY_ENVS
               if algorithms.get(name).has_workers and fits(algorithms.get(name), env)]


def test_every_algorithm_is_covered() -> None:
    """Each algorithm acts in at least one tiny env, by its learner or its workers."""
    assert {name for name, _ in ENVS} | {name for name, _, _ in WORKER_ENVS} == set(algorithms.available())


@pytest.mark.parametrize("name,env_id", ENVS)
def test_act_add_learn(name: str, env_id: str) -> None:
    algo = algorithms.get(name)
    cfg = small(algo)
    num_envs = 2
    envs = gym.vector.SyncVectorEnv([lambda: make(env_id)] * num_envs)
    spaces = envs.single_observation_space, envs.single_action_space
    algo.check_env(cfg, *spaces, env_id)
    policy = algo.make_policy(cfg, *spaces, device="cpu", seed=3, act_seed=[3, 0])
    learner = algo.make_learner(cfg, *spaces, device="cpu", seed=3)
    adder = algo.make_adder(cfg, num_envs, *spaces, envs.metadata["autoreset_mode"])
    assert set(learner.data.table_kinds) == set(algo.table_kinds)
    policy.load_weights(learner.weights())
    assert isinstance(policy.explore(0, 2, 0), dict)

    obs, _ = envs.reset(seed=1)
    adder.reset(obs)
    items: list[dict[str, np.ndarray]] = []
    for step in range(40):
        actions, extras = policy.act(obs)
        if isinstance(spaces[1], gym.spaces.Discrete):
            assert actions.dtype == np.int64 and actions.shape == (num_envs,)
        else:
            assert actions.dtype == np.float32 and actions.shape == (num_envs, 1)
            assert (actions >= spaces[1].low).all() and (actions <= spaces[1].high).all()
        assert all(len(value) == num_envs for value in extras.values())
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        out = adder.add(actions, extras, obs, rewards, terminated, truncated, infos, version=step // 10)
        assert out["version"].dtype == np.int64
        assert all(len(value) == len(out["version"]) for value in out.values())
        if len(out["version"]):
            items.append(out)
        assert policy.priorities(out) is None or len(policy.priorities(out)) == len(out["version"])  # type: ignore[arg-type]
    envs.close()
    batch = {key: np.concatenate([item[key] for item in items]) for key in items[0]}
    assert batch["version"].min() >= 0 and batch["version"].max() <= 3
    batch = {key: value[: learner.data.batch_items] for key, value in batch.items()}
    before = learner.num_updates
    metrics, priorities = learner.learn(batch, None)
    assert learner.num_updates > before and all(np.isfinite(v) for v in metrics.values())
    assert (priorities is not None) == learner.data.returns_priorities
    # importance weights: the learner's, from a batch's probabilities; only algorithms that sample prioritized
    n = len(batch["version"])
    probability = np.linspace(1.0, 4.0, n) / n
    weights = learner.weigh(probability)
    assert (weights is not None) == ("prioritized" in learner.data.table_kinds)
    if weights is not None:
        assert weights.dtype == np.float32 and weights.shape == (n,) and weights.max() == 1.0 and weights.min() > 0
        assert weights[0] == 1.0  # the least likely item weighs most
        np.testing.assert_array_equal(learner.weigh(np.full(n, 1.0 / n)), np.ones(n))  # uniform: as unweighted
        learner.learn(batch, weights)

    # Deterministic acting does not depend on the rng; two policies with one act_seed sample alike.
    policy.load_weights(learner.weights())
    twin = algo.make_policy(cfg, *spaces, device="cpu", seed=3, act_seed=[3, 0])
    twin.load_weights(learner.weights())
    probe = batch["obs"].reshape(-1, *spaces[0].shape)[:6]
    first = policy.act(probe, deterministic=True)[0]
    policy.act(probe)
    np.testing.assert_array_equal(policy.act(probe, deterministic=True)[0], first)
    np.testing.assert_array_equal(twin.act(probe, deterministic=True)[0], first)
    fresh = [algo.make_policy(cfg, *spaces, seed=3, act_seed=9) for _ in range(2)]
    for p in fresh:
        p.load_weights(learner.weights())
        p.explore(0, 1, 0)
    np.testing.assert_array_equal(fresh[0].act(probe)[0], fresh[1].act(probe)[0])


def test_every_algorithm_has_a_learner_or_workers() -> None:
    tested = {name for name, _ in ENVS} | {name for name, _, _ in WORKER_ENVS}
    assert tested == set(algorithms.available())
    assert {name for name, _, _ in WORKER_ENVS} == {n for n in algorithms.available() if algorithms.get(n).has_workers}
    for name, _, settings in WORKER_ENVS:
        assert small(algorithms.get(name), **settings).trains_with_workers()


@pytest.mark.parametrize("name,env_id,settings", WORKER_ENVS)
def test_worker_act_add_gradients(name: str, env_id: str, settings: dict[str, Any]) -> None:
    algo = algorithms.get(name)
    assert algo.has_workers
    cfg = small(algo, **settings)
    num_envs = 2
    envs = gym.vector.SyncVectorEnv([lambda: make(env_id)] * num_envs,
                                    autoreset_mode=gym.vector.AutoresetMode(algo.autoreset_mode))
    spaces = envs.single_observation_space, envs.single_action_space
    worker = algo.make_worker(cfg, *spaces, seed=3, act_seed=[3, 0])
    weights = worker.weights()
    policy = algo.make_policy(cfg, *spaces, device="cpu", seed=3, act_seed=[3, 0])
    policy.load_weights(weights)  # evaluators act on what workers publish
    adder = algo.make_adder(cfg, num_envs, *spaces, algo.autoreset_mode)
    obs, _ = envs.reset(seed=1)
    adder.reset(obs)
    pushed = 0
    worker.explore(0, 1, 0)
    for step in range(20):
        actions, extras = worker.act(obs)
        assert actions.dtype == np.int64 and actions.shape == (num_envs,)
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        out = adder.add(actions, extras, obs, rewards, terminated, truncated, infos, version=step)
        if len(out["version"]):
            grads, figures = worker.gradients(out)
            if grads is None:  # still filling its own buffer
                continue
            assert grads.keys() == weights.keys() and all(np.isfinite(v) for v in figures.values())
            assert all(g.dtype == np.float32 and g.shape == weights[k].shape for k, g in grads.items())
            pushed += 1
    envs.close()
    assert pushed >= 3
    probe = obs[:2]
    np.testing.assert_array_equal(policy.act(probe, deterministic=True)[0], worker.act(probe, deterministic=True)[0])


def test_drop_stale() -> None:
    batch = {"version": np.array([3, 7, 5, 9], np.int64), "obs": np.arange(8, dtype=np.float32).reshape(4, 2)}
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    kept, kept_weights, stale, invalid = drop_stale(batch, current_version=9, max_staleness=2, weights=weights)
    assert (stale, invalid) == (2, 0)
    np.testing.assert_array_equal(kept["version"], [7, 9])
    np.testing.assert_array_equal(kept["obs"], [[2, 3], [6, 7]])
    np.testing.assert_array_equal(kept_weights, [0.2, 0.4])  # importance weights follow their items
    kept, kept_weights, stale, invalid = drop_stale(batch, 9, None)
    assert stale == invalid == 0 and kept["version"] is batch["version"] and kept_weights is None
    kept, kept_weights, stale, invalid = drop_stale(batch, 9, 6, weights)
    assert stale == invalid == 0 and len(kept["obs"]) == 4 and kept_weights is weights
    kept, _, stale, invalid = drop_stale(batch, 100, 0)
    assert (stale, invalid) == (4, 0) and kept["obs"].shape == (0, 2)
    with pytest.raises(KeyError, match="version"):
        drop_stale({"obs": batch["obs"]}, 9, 2)


@pytest.mark.parametrize("max_staleness", [None, 2, 10**6])
def test_drop_stale_drops_versions_no_actor_acted_with(max_staleness: int | None) -> None:
    """A forged version (above the learner's own, or negative) is invalid whatever the staleness bound:
    a future one used to count as staleness below 0 and be trained on."""
    forged = [10**12, (1 << 63) - 1, -1, -(1 << 63)]
    batch = {"version": np.array([9, *forged, 8], np.int64), "obs": np.arange(6, dtype=np.float32)}
    kept, _, stale, invalid = drop_stale(batch, 9, max_staleness)
    assert invalid == 4 and stale == 0
    np.testing.assert_array_equal(kept["version"], [9, 8])


@pytest.mark.parametrize("name,env_id", ENVS)
def test_learner_starts_from_published_weights(name: str, env_id: str) -> None:
    """A learner fed another's published weights publishes exactly those (what a learner with no
    checkpoint starts from: the paramserver's newest); weights of another network are refused, with
    nothing copied."""
    algo = algorithms.get(name)
    cfg = small(algo)
    env = make(env_id)
    spaces = env.observation_space, env.action_space
    fleet = algo.make_learner(cfg, *spaces, device="cpu", seed=3)
    fresh = algo.make_learner(cfg, *spaces, device="cpu", seed=4)
    published = fleet.weights()
    own = fresh.weights()
    assert any(not np.array_equal(own[key], published[key]) for key in published)  # seeds differ

    key = sorted(published)[0]
    for bad in ({k: v for k, v in published.items() if k != key},
                {**published, key: np.zeros((*published[key].shape, 2), np.float32)},
                {**published, "unexpected": np.zeros(1, np.float32)}):
        with pytest.raises(ValueError, match="weights"):
            fresh.load_weights(bad)
        assert all(np.array_equal(fresh.weights()[k], own[k]) for k in own)

    fresh.load_weights(published)
    assert set(fresh.weights()) == set(published)
    for k, value in fresh.weights().items():
        np.testing.assert_array_equal(value, published[k], err_msg=k)


def test_ppo_anneals_on_from_the_fleets_env_steps() -> None:
    """A PPO learner with no checkpoint resumes its annealing at the fleet's env steps, never going back."""
    algo = algorithms.get("ppo")
    env = make("CartPole-v1")
    learner = algo.make_learner(small(algo, anneal_env_steps=10_000), env.observation_space, env.action_space,
                                device="cpu", seed=3)
    learner.resume_env_steps(4_000)
    assert learner.state()["env_steps"] == 4_000
    learner.resume_env_steps(1_000)
    assert learner.state()["env_steps"] == 4_000
