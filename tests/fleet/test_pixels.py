"""Pixels: Atari envs with the standard preprocessing, the CNN torso, uint8 to the learner, refusals,
and a short Pong run through every service."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from harness.fleet_helpers import CONFIGS, only_run_dir, read_csv, rlfleet
from rlfleet.common import atari
from rlfleet.common.algorithms.dqn.learner import DQNLearner
from rlfleet.common.algorithms.dqn.policy import DQNPolicy
from rlfleet.common.config import EnvConfig, load
from rlfleet.common.envs import EnvError, env_factory, experience_schema, make_vector_env


def wrappers(env) -> list[str]:
    names = []
    while hasattr(env, "env"):
        names.append(type(env).__name__)
        env = env.env
    return names


def test_training_envs_clip_rewards_and_end_on_a_lost_life_evaluations_do_not() -> None:
    cfg = EnvConfig(id="ALE/Breakout-v5")
    train, evaluation = env_factory(cfg)(), env_factory(cfg, training=False)()
    try:
        assert {"EpisodicLife", "ClipReward", "FireReset", "AtariPreprocessing"} <= set(wrappers(train))
        assert "EpisodicLife" not in wrappers(evaluation) and "ClipReward" not in wrappers(evaluation)
        assert train.observation_space.shape == (4, 84, 84) and train.observation_space.dtype == np.uint8
        obs, _ = train.reset(seed=0)
        np.testing.assert_array_equal(obs[0], obs[-1])  # the first stack repeats the reset frame
        ale = train.unwrapped.ale
        lives = ale.lives()
        terminated = truncated = False
        while not (terminated or truncated):
            obs, reward, terminated, truncated, _ = train.step(train.action_space.sample())
            assert reward in (-1.0, 0.0, 1.0)
        assert terminated and ale.lives() == lives - 1  # one life lost ends the training episode...
        train.reset()
        assert ale.lives() == lives - 1  # ...and the game goes on from there
    finally:
        train.close()
        evaluation.close()


def test_frames_stay_uint8_from_the_env_to_the_learner() -> None:
    cfg = load(str(CONFIGS / "pong-dqn.yaml"), [])
    schema = experience_schema(cfg)
    assert schema["obs"] == ("uint8", (4, 84, 84)) and schema["next_obs"] == ("uint8", (4, 84, 84))
    envs = make_vector_env(cfg.env, 0)
    try:
        obs, _ = envs.reset(seed=0)
        space, actions = envs.single_observation_space, envs.single_action_space
    finally:
        envs.close()
    policy = DQNPolicy(cfg.algorithm, space, actions)
    assert not policy._numpy  # a CNN acts in torch
    learner = DQNLearner(cfg.algorithm, space, actions, device="cpu")
    seen: list[torch.dtype] = []
    learner.online.torso.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    n = 8
    batch = {"obs": np.repeat(obs[:1], n, 0), "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32),
             "next_obs": np.repeat(obs[:1], n, 0), "discount": np.full(n, 0.97, np.float32)}
    metrics, priorities = learner.learn(batch)
    assert seen and set(seen) == {torch.uint8}  # scaled inside the torso, on the learner's device
    assert np.isfinite(metrics["loss"]) and priorities.shape == (n,)
    policy.load_weights(learner.weights())
    np.testing.assert_allclose(policy.q_values(obs), learner.online(torch.from_numpy(obs)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)


def test_actor_priorities_in_bfloat16_stay_close_to_float32_and_only_where_asked() -> None:
    import gymnasium as gym

    from rlfleet.common.algorithms.dqn.config import DQNConfig

    frames, actions = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6)
    rng = np.random.default_rng(5)
    n = 64
    items = {"obs": rng.integers(0, 256, (n, 4, 84, 84), np.uint8), "action": rng.integers(0, 6, n),
             "reward": rng.normal(size=n).astype(np.float32),
             "next_obs": rng.integers(0, 256, (n, 4, 84, 84), np.uint8), "discount": np.full(n, 0.97, np.float32)}
    exact = DQNPolicy(DQNConfig(priorities_dtype="float32"), frames, actions, seed=3)
    brain = DQNPolicy(DQNConfig(priorities_dtype="bfloat16"), frames, actions, seed=3)
    assert brain.bf16_priorities and not exact.bf16_priorities
    p32, p16 = exact.priorities(items), brain.priorities(items)
    assert p16 is not None and p32 is not None and p16.dtype == np.float64
    assert not np.array_equal(p16, p32)  # computed in bfloat16 indeed
    np.testing.assert_allclose(p16, p32, rtol=0.1, atol=0.02)
    mlp = DQNPolicy(DQNConfig(), gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2))
    assert not mlp.bf16_priorities  # auto: an MLP stays in float32


@pytest.mark.parametrize(("sets", "says"), [
    (["env.id=ALE/NoSuchGame-v5"], "ale-py ships the ROMs of"),
    (["env.atari.frame_stack=0"], "env.atari.frame_stack"),
    (["algorithm.torso=mlp"], "torso=mlp flattens them into an MLP"),
    (["CARTPOLE", "algorithm.torso=nature_cnn"], "torso=nature_cnn needs image observations"),
    (["env.kwargs.frameskip=4"], "set env.atari.frame_skip instead"),
])
def test_bad_pixel_configs_are_refused_with_what_is_allowed(tmp_path: Path, sets: list[str], says: str) -> None:
    config = "cartpole-dqn.yaml" if sets[0] == "CARTPOLE" else "pong-dqn.yaml"
    args = [a for s in sets if s != "CARTPOLE" for a in ("--set", s)]
    proc = rlfleet("up", "--config", str(CONFIGS / config), "--max-seconds", "5", "--runs", str(tmp_path),
                   *args, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert says in proc.stdout, proc.stdout[-2000:]


def test_the_roms_ship_and_a_frameskip_in_kwargs_is_refused() -> None:
    assert {"pong", "breakout"} <= set(atari.rom_ids())
    with pytest.raises(EnvError, match="frame_skip"):
        env_factory(EnvConfig(id="ALE/Pong-v5", kwargs={"frameskip": 4}))()


@pytest.mark.e2e
def test_a_short_pong_run_inserts_samples_and_updates_through_every_service(tmp_path: Path) -> None:
    proc = rlfleet("up", "--config", str(CONFIGS / "pong-dqn.yaml"), "--actors", "1", "--max-env-steps", "4000",
                   "--max-seconds", "150", "--runs", str(tmp_path),
                   "--set", "replay.tables.0.capacity=3000", "--set", "replay.tables.0.min_size=500",
                   "--set", "env.num_envs=2", "--set", "evaluator.every_steps=1500", "--set", "evaluator.episodes=1",
                   "--set", "env.max_episode_steps=600", "--set", "learner.publish_every=10", timeout=240)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}"
    progress = read_csv(only_run_dir(tmp_path) / "progress.csv")
    last = progress[-1]
    assert int(last["updates"]) > 10 and float(last["replay_size"]) > 500, last
    assert last["eval_return"] not in ("", None), last  # whole (time-limited) games scored
    log = (only_run_dir(tmp_path) / "logs" / "replay-0.log").read_text()
    assert "Traceback" not in log


def test_ppo_acts_and_learns_on_frames_with_one_cnn_under_both_heads() -> None:
    from rlfleet.common.algorithms.adders.segments import SegmentAdder
    from rlfleet.common.algorithms.ppo.learner import PPOLearner
    from rlfleet.common.algorithms.ppo.networks import PPOCnnNetworks
    from rlfleet.common.algorithms.ppo.policy import PPOPolicy

    cfg = load(str(CONFIGS / "breakout-ppo.yaml"), ["algorithm.segment_length=8", "algorithm.minibatch_size=16",
                                                    "algorithm.batch_segments=4"])
    envs = make_vector_env(cfg.env.model_copy(update={"num_envs": 2}), 0, "SameStep")
    space, actions = envs.single_observation_space, envs.single_action_space
    policy = PPOPolicy(cfg.algorithm, space, actions)
    learner = PPOLearner(cfg.algorithm, space, actions, device="cpu")
    assert isinstance(learner.net, PPOCnnNetworks)
    adder = SegmentAdder(2, 8, space, actions, "SameStep", {"logp": ("float32", ()), "value": ("float32", ())})
    segments = []
    try:
        obs, _ = envs.reset(seed=0)
        adder.reset(obs)
        while len(segments) < 2:
            act, extras = policy.act(obs)
            obs, reward, terminated, truncated, infos = envs.step(act)
            items = adder.add(act, extras, obs, reward, terminated, truncated, infos, 0)
            if len(items["obs"]):
                segments.append(items)
    finally:
        envs.close()
    batch = {k: np.concatenate([s[k] for s in segments]) for k in segments[0]}
    assert batch["obs"].dtype == np.uint8 and batch["obs"].shape == (4, 8, 4, 84, 84)
    before = {k: v.copy() for k, v in learner.weights().items()}
    figures, _ = learner.learn(batch)
    assert np.isfinite(figures["loss"]) and figures["value_drift"] < 1e-3  # the values acted with are the learner's
    after = learner.weights()
    assert any(not np.array_equal(before[k], after[k]) for k in after)
    policy.load_weights(after)
    out, value = policy._forward(obs)
    with torch.no_grad():
        want_out, want_value = learner.net.heads(torch.from_numpy(obs))
    np.testing.assert_allclose(out, want_out.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value, want_value.numpy(), rtol=1e-5, atol=1e-5)
    # it learns: on this fixed batch the loss goes down, its value part (returns all but fixed) most of all
    for _ in range(4):
        last, _ = learner.learn(batch)
    assert last["value_loss"] < 0.5 * figures["value_loss"], (figures, last)
    assert last["loss"] < figures["loss"], (figures, last)


def test_ppo_refuses_observation_normalisation_of_frames(tmp_path: Path) -> None:
    proc = rlfleet("up", "--config", str(CONFIGS / "breakout-ppo.yaml"), "--max-seconds", "5", "--runs",
                   str(tmp_path), "--set", "algorithm.obs_norm=true", timeout=120)
    assert proc.returncode == 2 and "allowed for images: obs_norm false" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.e2e
def test_a_short_breakout_ppo_round_trains_through_every_service(tmp_path: Path) -> None:
    proc = rlfleet("up", "--config", str(CONFIGS / "breakout-ppo.yaml"), "--actors", "1", "--max-env-steps", "1500",
                   "--max-seconds", "150", "--runs", str(tmp_path), "--set", "algorithm.segment_length=32",
                   "--set", "actor.steps_per_round=32", "--set", "algorithm.minibatch_size=64",
                   "--set", "evaluator.every_steps=1000", "--set", "evaluator.episodes=1",
                   "--set", "env.max_episode_steps=400", timeout=240)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}"
    last = read_csv(only_run_dir(tmp_path) / "progress.csv")[-1]
    assert int(last["updates"]) >= 8 and int(last["weights_version"]) >= 3, last
