"""TD3 (common/algorithms/td3/): added as its folder, its config file and one registry line. It solves
Pendulum in the serial runner; the actor and the targets step only on every policy_delay-th update;
the target policy smoothing noise is clipped and actions stay in the env's bounds; a checkpoint
continues the same run; the registry and the experiment file know it."""

from __future__ import annotations

import io
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlfleet.common.algorithms as algorithms
from rlfleet.cli.evaluate import load_for_eval
from rlfleet.cli.serial import train_serial
from rlfleet.common import config
from rlfleet.common.algorithms.td3.config import TD3Config
from rlfleet.common.algorithms.td3.learner import TD3Learner
from rlfleet.common.algorithms.td3.policy import TD3Policy

ROOT = Path(__file__).resolve().parents[3]
OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
LOPSIDED = gym.spaces.Box(np.array([-3.0, 0.5], np.float32), np.array([1.0, 2.0], np.float32))
SMALL = {"hidden": [16], "critic_hidden": [16], "batch_size": 32}


def batch(n: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            "action": rng.uniform(LOPSIDED.low, LOPSIDED.high, (n, 2)).astype(np.float32),
            "reward": rng.normal(size=n).astype(np.float32), "next_obs": rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            "discount": np.full(n, 0.99, np.float32)}


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()])


def test_serial_runner_solves_pendulum(tmp_path: Path) -> None:
    cfg = config.load(ROOT / "configs" / "pendulum-td3.yaml", [], environ={})
    result = train_serial(cfg, until_return=-200.0, max_env_steps=30_000, run_dir=tmp_path)
    assert result.solved, f"best {result.best} after {result.env_steps} env steps"
    # one update per env step from min_size on, the actor's half of them
    assert result.updates >= result.env_steps - cfg.replay.tables[0].min_size - 1
    loaded = load_for_eval(tmp_path / "learner" / "checkpoint.pt")
    assert loaded.exact and loaded.cfg.algorithm.name == "td3" and loaded.version == result.version


@pytest.mark.parametrize("delay", [2, 3])
def test_actor_and_targets_step_only_on_every_policy_delay_th_update(delay: int) -> None:
    learner = TD3Learner(TD3Config(**SMALL, policy_delay=delay, lr=1e-2), OBS, LOPSIDED, device="cpu", seed=0)
    nets = learner.nets
    parts = {"actor": nets.actor, "critic": nets.critic, "actor_target": nets.actor_target,
             "critic_target": nets.critic_target}
    torch.testing.assert_close(flat(nets.actor_target), flat(nets.actor))  # the targets start as copies
    torch.testing.assert_close(flat(nets.critic_target), flat(nets.critic))
    before = {name: flat(net) for name, net in parts.items()}
    for k in range(1, 3 * delay + 1):
        due = learner.policy_update_due()
        grads, figures, _ = learner.compute_gradients(batch(seed=k))
        assert due == (k % delay == 0)
        assert ("actor" in grads) == due and ("actor_loss" in figures) == due
        learner.apply_gradients(learner.average(grads))
        assert learner.num_updates == k
        after = {name: flat(net) for name, net in parts.items()}
        changed = {name: not torch.equal(before[name], after[name]) for name in parts}
        assert changed == {"actor": due, "critic": True, "actor_target": due, "critic_target": due}, k
        if due:  # Polyak: the targets moved tau of the way towards the networks
            tau = learner.cfg.tau
            torch.testing.assert_close(after["actor_target"], before["actor_target"] * (1 - tau) + after["actor"] * tau)
            torch.testing.assert_close(after["critic_target"],
                                       before["critic_target"] * (1 - tau) + after["critic"] * tau)
        before = after
    assert int(learner.optimizers["actor"].state[0]["step"]) == 3
    assert int(learner.optimizers["critic"].state[0]["step"]) == 3 * delay


def test_target_policy_smoothing_noise_is_clipped() -> None:
    cfg = TD3Config(**SMALL, policy_noise=10.0, noise_clip=0.3)
    learner = TD3Learner(cfg, OBS, LOPSIDED, device="cpu", seed=0)
    next_obs = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (4000, 3)), dtype=torch.float32)
    clean = learner.nets.act(learner.nets.actor_target, next_obs)
    smoothed = learner.smoothed_target_action(next_obs)
    assert smoothed.min() >= -1.0 and smoothed.max() <= 1.0
    shift = (smoothed - clean).abs()
    assert shift.max() <= 0.3 + 1e-6
    # std 10 clipped at 0.3: nearly every draw is clipped, both ways (unless clipped again at the bounds)
    inside = (clean.abs() < 0.65)
    assert (shift[inside] > 0.3 - 1e-6).float().mean() > 0.95
    assert ((smoothed - clean)[inside] > 0).any() and ((smoothed - clean)[inside] < 0).any()
    with torch.no_grad():  # a saturated target actor: the noise would push its actions out of [-1, 1]
        for p in learner.nets.actor_target.parameters():
            p.mul_(40.0)
    smoothed = learner.smoothed_target_action(next_obs)
    assert smoothed.min() == -1.0 and smoothed.max() == 1.0
    quiet = TD3Learner(TD3Config(**SMALL, policy_noise=0.0), OBS, LOPSIDED, device="cpu", seed=0)
    torch.testing.assert_close(quiet.smoothed_target_action(next_obs), clean)


def test_actions_stay_inside_asymmetric_bounds_with_scaled_noise() -> None:
    cfg = TD3Config(**SMALL, learning_starts=10, exploration_noise=0.1)
    policy = TD3Policy(cfg, OBS, LOPSIDED, seed=0, act_seed=1)
    learner = TD3Learner(cfg, OBS, LOPSIDED, device="cpu", seed=0)
    policy.load_weights(learner.weights())
    obs = np.random.default_rng(1).uniform(-1, 1, (2000, 3)).astype(np.float32)
    assert policy.explore(0, 1, 0)["warmup_steps_left"] == 10.0
    warm, _ = policy.act(obs)
    assert warm[:, 0].min() < -2.5 and warm[:, 0].max() > 0.5  # uniform over the box
    assert policy.explore(0, 1, 10) == {"warmup_steps_left": 0.0, "exploration_noise": 0.1}
    noisy, greedy = policy.act(obs)[0], policy.act(obs, deterministic=True)[0]
    # the noise is 0.1 of half the range per dimension: std 0.2 on the [-3, 1] axis, 0.075 on [0.5, 2]
    inside = (np.abs(greedy - (LOPSIDED.low + LOPSIDED.high) / 2) < 0.5 * (LOPSIDED.high - LOPSIDED.low) * 0.6).all(1)
    np.testing.assert_allclose((noisy - greedy)[inside].std(0), [0.2, 0.075], rtol=0.1)
    with torch.no_grad():  # the deterministic action is the learner's actor, scaled
        unit = learner.nets.act(learner.nets.actor, torch.as_tensor(obs)).double().numpy()
    np.testing.assert_allclose(greedy, LOPSIDED.low + (unit + 1) / 2 * (LOPSIDED.high - LOPSIDED.low), atol=1e-5)
    with torch.no_grad():  # a wide, off-centre actor: tanh saturates at both ends
        for p in learner.nets.actor.parameters():
            p.mul_(40.0)
    policy.load_weights(learner.weights())
    for actions in (warm, policy.act(obs)[0], policy.act(obs, deterministic=True)[0]):
        assert actions.dtype == np.float32 and actions.shape == (2000, 2)
        assert all(LOPSIDED.contains(a) for a in actions)
    with pytest.raises(ValueError, match="missing"):
        policy.load_weights({})


def test_checkpoint_continues_the_same_run() -> None:
    cfg = TD3Config(**SMALL)
    first = TD3Learner(cfg, OBS, LOPSIDED, device="cpu", seed=0)
    for k in range(3):  # odd: the next update is a delayed one, which the checkpoint must remember
        first.learn(batch(seed=k))
    buffer = io.BytesIO()
    torch.save(first.state(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    second = TD3Learner(cfg, OBS, LOPSIDED, device="cpu", seed=7)  # other weights and noise until loaded
    second.load_state(state)
    assert second.num_updates == 3
    for k in range(3, 5):
        a, pa = first.learn(batch(seed=k))
        b, pb = second.learn(batch(seed=k))
        assert a == b and ("actor_loss" in a) == (k == 3)  # update 4 is a delayed one, 5 is not
        np.testing.assert_array_equal(pa, pb)
    for name, value in first.nets.state_dict().items():
        torch.testing.assert_close(second.nets.state_dict()[name], value, rtol=0, atol=0)
    for (name, x), y in zip(first.weights().items(), second.weights().values(), strict=True):
        np.testing.assert_array_equal(x, y, err_msg=name)
    with pytest.raises(ValueError, match="not a TD3 checkpoint"):
        second.load_state({**state, "algorithm": "sac"})


def test_registry_and_experiment_file() -> None:
    assert "td3" in algorithms.available()
    algo = algorithms.get("td3")
    assert algo.name == "td3" and algo.table_kinds == ("uniform", "prioritized") and not algo.has_workers
    cfg = config.load(ROOT / "configs" / "pendulum-td3.yaml", [], environ={})
    assert isinstance(cfg.algorithm, TD3Config)
    assert (cfg.algorithm.gamma, cfg.algorithm.policy_delay, cfg.algorithm.hidden) == (0.98, 2, [64, 64])
    assert cfg.replay.tables[0].samples_per_insert == cfg.algorithm.batch_size  # one update per env step
    pendulum = gym.make("Pendulum-v1")
    algorithms.check_env(cfg.algorithm, pendulum.observation_space, pendulum.action_space, "Pendulum-v1")
    with pytest.raises(algorithms.EnvMismatch, match="algorithm td3 needs continuous actions; env CartPole-v1"):
        algorithms.check_env(cfg.algorithm, OBS, gym.spaces.Discrete(2), "CartPole-v1")
    with pytest.raises(config.ConfigError, match="policy_delay"):
        config.load(ROOT / "configs" / "pendulum-td3.yaml", ["algorithm.policy_delay=0"], environ={})
    with pytest.raises(config.ConfigError, match="noise_clip"):
        config.load(ROOT / "configs" / "pendulum-td3.yaml", ["algorithm.noise_clip=-1"], environ={})
