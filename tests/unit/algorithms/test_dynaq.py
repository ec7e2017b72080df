"""Parallel Dyna-Q without sockets: the world model, its held-out split, the imagined env, the refusals."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from harness.fleet_helpers import CONFIGS
from rlfleet.common import algorithms
from rlfleet.common.config import ConfigError, load
from rlfleet.common.config.planning import WorldModelConfig
from rlfleet.common.envs import experience_schema
from rlfleet.common.planning.dynamics import (
    VAL_ERROR,
    DynamicsLearner,
    ModelMismatch,
    holdout_mask,
    load_dynamics_model,
    make_dynamics_model,
)
from rlfleet.common.planning.imagined_env import ImaginedEnv

DYNAQ = CONFIGS / "cartpole-dynaq.yaml"


def cartpole_transitions(steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One-step transitions of a random policy, as the real table holds them (discount 0: terminal)."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in ("obs", "action", "reward", "next_obs", "discount")}
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        a = int(rng.integers(2))
        nxt, r, term, trunc, _ = env.step(a)
        for k, v in zip(rows, (obs, a, r, nxt, 0.0 if term else 0.99), strict=True):
            rows[k].append(v)
        obs = nxt if not (term or trunc) else env.reset()[0]
    return {k: np.asarray(v, np.int64 if k == "action" else np.float32) for k, v in rows.items()}


def fitted_model(updates: int = 1500) -> tuple[DynamicsLearner, dict[str, np.ndarray]]:
    data = cartpole_transitions(8000)
    env = gym.make("CartPole-v1")
    learner = DynamicsLearner(WorldModelConfig(), env.observation_space, env.action_space, device="cpu", seed=0)
    rng = np.random.default_rng(1)
    for _ in range(updates):
        keys = rng.integers(0, len(data["obs"]), 256)
        learner.learn({k: v[keys] for k, v in data.items()}, keys)
    return learner, data


def test_the_world_model_fits_cartpole_and_says_so_on_data_it_never_trained_on() -> None:
    learner, data = fitted_model()
    assert learner.val_error < 0.05, learner.val_error  # the gate of configs/cartpole-dynaq.yaml
    net = learner.net
    held = np.flatnonzero(holdout_mask(np.arange(len(data["obs"])), 0.1))
    nxt, reward, term = net.predict(data["obs"][held], data["action"][held])
    err = np.abs(nxt - data["next_obs"][held]).max(axis=0)
    spread = data["next_obs"][held].std(axis=0)
    assert (err < 0.25 * spread).all(), (err, spread)
    miss = np.abs(reward - 1.0)  # CartPole pays 1 a step
    assert miss.mean() < 0.04 and miss.max() < 0.08, (miss.mean(), miss.max())
    truth = data["discount"][held] == 0
    assert (term == truth).mean() > 0.97 and term[truth].mean() > 0.6, (term[truth].mean(), truth.sum())
    # the published arrays are the whole model, with its validation error
    arrays = learner.weights()
    fresh = make_dynamics_model(WorldModelConfig(), gym.make("CartPole-v1").observation_space,
                             gym.make("CartPole-v1").action_space)
    assert load_dynamics_model(fresh, arrays) == pytest.approx(float(arrays[VAL_ERROR]))
    assert np.allclose(fresh.predict(data["obs"][:5], data["action"][:5])[0], net.predict(data["obs"][:5],
                                                                                        data["action"][:5])[0])


def test_an_untrained_model_has_no_validation_error_yet_and_a_bad_one_a_large_one() -> None:
    env = gym.make("CartPole-v1")
    learner = DynamicsLearner(WorldModelConfig(), env.observation_space, env.action_space, device="cpu")
    assert learner.val_error == float("inf")
    data = cartpole_transitions(3000)
    keys = np.arange(3000)
    learner.net.body[-1].bias.data += 5.0  # far off before any update
    learner.learn(data, keys)  # 300 held out: enough to count, one update: still far off
    assert 1.0 < learner.val_error < float("inf")


def test_the_held_out_split_is_a_fixed_fraction_of_keys() -> None:
    keys = np.arange(100_000)
    mask = holdout_mask(keys, 0.1)
    assert 0.09 < mask.mean() < 0.11
    assert (holdout_mask(keys[::7], 0.1) == mask[::7]).all()  # a key is held out or not, whatever the batch
    assert 0.09 < mask[:1000].mean() < 0.11  # spread, not a range of keys


def test_a_model_of_another_env_is_refused_with_what_it_does_not_fit() -> None:
    pendulum = gym.make("Pendulum-v1")
    other = DynamicsLearner(WorldModelConfig(), pendulum.observation_space, pendulum.action_space, device="cpu")
    cart = gym.make("CartPole-v1")
    net = make_dynamics_model(WorldModelConfig(), cart.observation_space, cart.action_space)
    with pytest.raises(ModelMismatch, match="do not fit this env's model.*shape"):
        load_dynamics_model(net, other.weights())
    with pytest.raises(ModelMismatch, match="1-D Box"):
        make_dynamics_model(WorldModelConfig(), gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), cart.action_space)


def test_imagined_transitions_have_the_real_schema_and_end_like_real_episodes() -> None:
    learner, data = fitted_model(600)
    cfg = load(DYNAQ, environ={})
    algo = algorithms.get("dqn")
    env = gym.make("CartPole-v1")
    n, k = 16, 4
    rng = np.random.default_rng(0)
    imagined = ImaginedEnv(learner.net, n, k, lambda m: data["obs"][rng.integers(0, 4000, m)], env.observation_space,
                           algo.autoreset_mode)
    adder = algo.make_adder(cfg.algorithm, n, env.observation_space, env.action_space, algo.autoreset_mode)
    obs, _ = imagined.reset()
    adder.reset(obs)
    items, ends = [], 0
    for _ in range(40):
        actions = rng.integers(0, 2, n)
        obs, rewards, term, trunc, infos = imagined.step(actions)
        assert not (term & trunc).any()
        ends += int((term | trunc).sum())
        items.append(adder.add(actions, {}, obs, rewards, term, trunc, infos, 7))
    batch = {c: np.concatenate([i[c] for i in items]) for c in items[0]}
    schema = experience_schema(cfg)
    assert {c: (v.dtype.name, v.shape[1:]) for c, v in batch.items()} == schema
    assert len(batch["obs"]) == imagined.steps  # every model step one transition, the reset steps dropped
    assert (batch["version"] == 7).all()
    assert ends >= imagined.steps // k  # no rollout longer than rollout_length
    terminal = batch["discount"] == 0
    assert ((batch["discount"] == 0) | np.isclose(batch["discount"], cfg.algorithm.gamma)).all()
    # the model's terminations are where CartPole's are: the pole past 12 degrees or the cart past 2.4
    if terminal.any():
        end = batch["next_obs"][terminal]
        assert ((np.abs(end[:, 2]) > 0.15) | (np.abs(end[:, 0]) > 2.0)).mean() > 0.8


@pytest.mark.parametrize("sets, says", [
    (["planning.imagined_ratio=1.5"], "planning.imagined_ratio = 1.5: Input should be less than or equal to 1"),
    (["planning.imagined_ratio=-0.1"], "planning.imagined_ratio = -0.1"),
    (["planning.rollout_length=0"], "planning.rollout_length = 0: Input should be greater than or equal to 1"),
    (["sync=barrier", "replay.tables.0.samples_per_insert=null"], "planning.enabled with sync=barrier"),
    (["algorithm.n_step=3"], "algorithm.n_step=3: the world model learns one-step dynamics"),
    (["planning.table=main"], "planning.table='main' is the learner's real table"),
    (["planning.table=dreams"], "planning.table='dreams': allowed: one of ['imagined', 'main']"),
    (["learners=2"], "planning.enabled with learners=2"),
])
def test_bad_planning_configs_are_refused_with_what_is_allowed(sets: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(DYNAQ, environ={}, sets=sets)
    assert says in str(err.value)


def test_planning_off_changes_nothing_and_the_dynaq_config_loads() -> None:
    cfg = load(CONFIGS / "cartpole-dynaq.yaml", environ={})
    assert cfg.planning.enabled and cfg.algorithm.n_step == 1
    plain = load(CONFIGS / "cartpole-dqn.yaml", environ={})
    assert not plain.planning.enabled


def test_planners_and_modeler_are_idle_services_when_planning_is_off(tmp_path: Path) -> None:
    from rlfleet.common.runtime import ServiceArgs
    from rlfleet.services.modeler.main import build as build_modeler
    from rlfleet.services.planner.main import build as build_planner

    cfg = load(CONFIGS / "cartpole-dqn.yaml", environ={})
    for build, role in ((build_planner, "planner"), (build_modeler, "modeler")):
        service = build(cfg, ServiceArgs(role))
        assert service.health()["idle"].startswith("planning.enabled is false"), role
        service.stop()
        service.run()  # returns at once once stopped
        service.close()


def test_the_gate_follows_the_published_model_and_ignores_one_of_another_env(caplog) -> None:
    """Over real sockets: a world model of another observation shape is ignored with one logged error; a
    model of this env opens the gate only while its validation error is below planning.gate."""
    from harness.paramserver_procs import ShardProcesses
    from rlfleet.common.clients.weights_publisher import WeightsPublisher
    from rlfleet.common.config.planning import PLANNING_MODEL
    from rlfleet.common.planning.model_watch import ModelWatch

    with ShardProcesses(1) as shards:
        cfg = load(DYNAQ, environ={}, sets=[f"network.paramserver=[{shards.addresses[0]}]"])
        cart, pendulum = gym.make("CartPole-v1"), gym.make("Pendulum-v1")
        watch = ModelWatch(cfg, "planner-test", cart.observation_space, cart.action_space, every_s=0.0)
        publisher = WeightsPublisher(shards.addresses, "modeler", model=PLANNING_MODEL)
        try:
            assert not watch.refresh() and not watch.open  # nothing published: closed
            other = DynamicsLearner(WorldModelConfig(), pendulum.observation_space, pendulum.action_space)
            publisher.publish(0, other.weights())
            with caplog.at_level("ERROR"):
                assert not watch.refresh()
            assert not watch.open and "do not fit this env's model" in caplog.text
        finally:
            publisher.close()
            watch.close()
    with ShardProcesses(1) as shards:  # a fresh paramserver: it keeps a model name's first layout
        cfg = load(DYNAQ, environ={}, sets=[f"network.paramserver=[{shards.addresses[0]}]"])
        watch = ModelWatch(cfg, "planner-test", cart.observation_space, cart.action_space, every_s=0.0)
        publisher = WeightsPublisher(shards.addresses, "modeler", model=PLANNING_MODEL)
        try:
            learner, _ = fitted_model(300)
            for version, error in enumerate((0.5, 0.01, 0.2)):
                learner.val_error = error
                publisher.publish(version, learner.weights())
                assert watch.refresh() and watch.version == version
                assert watch.open == (error < cfg.planning.gate), (version, error)
        finally:
            publisher.close()
            watch.close()
