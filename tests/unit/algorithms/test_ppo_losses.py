"""PPO's pieces by hand: GAE, the clipped surrogate, value clipping, entropy and log-probs,
advantage normalisation; the learner's GAE with truncation bootstrap; checkpoints."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.common.algorithms.ppo.config import PPOConfig
from rlfleet.common.algorithms.ppo.learner import PPOLearner
from rlfleet.common.algorithms.ppo.losses import (
    behaviour_weights,
    clipped_surrogate,
    gae,
    normalize_advantage,
    value_loss,
)
from rlfleet.common.algorithms.ppo.policy import PPOPolicy


def test_gae_by_hand() -> None:
    g, lam = 0.9, 0.5
    rewards = np.array([[1.0, 2.0, 3.0]])
    values = np.array([[0.5, 1.0, 1.5]])
    next_values = np.array([[1.0, 1.5, 2.0]])
    # no ending: deltas 1 + .9 - .5 = 1.4, 2 + 1.35 - 1 = 2.35, 3 + 1.8 - 1.5 = 3.3
    adv, ret = gae(rewards, values, next_values, np.zeros((1, 3), bool), np.zeros((1, 3), bool), g, lam)
    a2 = 3.3
    a1 = 2.35 + 0.45 * a2
    a0 = 1.4 + 0.45 * a1
    np.testing.assert_allclose(adv, [[a0, a1, a2]])
    np.testing.assert_allclose(ret, adv + values)
    # terminated after step 1: no bootstrap there and the trace stops
    term = np.array([[False, True, False]])
    adv, _ = gae(rewards, values, next_values, term, term, g, lam)
    np.testing.assert_allclose(adv, [[1.4 + 0.45 * 1.0, 2.0 - 1.0, 3.3]])
    # truncated after step 1: bootstrap from next_values (the final obs' value), trace stops
    trunc = np.array([[False, True, False]])
    adv, _ = gae(rewards, values, next_values, np.zeros((1, 3), bool), trunc, g, lam)
    np.testing.assert_allclose(adv, [[1.4 + 0.45 * 2.35, 2.35, 3.3]])


def test_surrogate_value_entropy_by_hand() -> None:
    ratio = torch.tensor([1.5, 0.5, 1.1, 0.7])
    adv = torch.tensor([1.0, 1.0, -2.0, -1.0])
    # per row max(-A r, -A clip(r)): max(-1.5, -1.2) = -1.2; max(-.5, -.8) = -.5; max(2.2, 2.2) = 2.2;
    # max(.7, .8) = .8
    assert clipped_surrogate(ratio, adv, 0.2).item() == pytest.approx((-1.2 - 0.5 + 2.2 + 0.8) / 4)
    value, old, ret = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.5]), torch.tensor([3.0, 1.0])
    assert value_loss(value, old, ret, None).item() == pytest.approx((1.0 + 1.0) / 2)
    # clipped to old +- 0.2: 1.2 and 0.3 -> (3 - 1.2)^2 = 3.24 > 1; (1 - .3)^2 = .49 < 1
    assert value_loss(value, old, ret, 0.2).item() == pytest.approx((3.24 + 1.0) / 2)
    normed = normalize_advantage(torch.tensor([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(normed.numpy(), [-1.0, 0.0, 1.0], atol=1e-6)
    assert normalize_advantage(torch.tensor([5.0])).item() == 5.0


def test_logp_entropy_match_torch_distributions() -> None:
    cfg = PPOConfig(hidden=[8], log_std_init=-0.3)
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    obs_space = gym.spaces.Box(-5, 5, (3,), np.float32)
    learner = PPOLearner(cfg, obs_space, box, device="cpu", seed=1)
    obs = torch.randn(5, 3)
    action = torch.randn(5, 2)
    logp, entropy, _ = learner.net.evaluate(obs, action)
    dist = torch.distributions.Normal(learner.net.actor(obs), learner.net.log_std.exp())
    torch.testing.assert_close(logp, dist.log_prob(action).sum(1))
    torch.testing.assert_close(entropy, dist.entropy().sum(1))
    # the numpy policy samples with the same log-prob the learner computes
    policy = PPOPolicy(cfg, obs_space, box, seed=1, act_seed=0)
    policy.load_weights(learner.weights())
    env_action, extras = policy.act(obs.numpy())
    raw = torch.as_tensor(extras["raw_action"])
    np.testing.assert_allclose(extras["logp"], learner.net.evaluate(obs, raw)[0].detach().numpy(), rtol=1e-5)
    np.testing.assert_array_equal(env_action, np.clip(extras["raw_action"], -1, 1))
    np.testing.assert_allclose(extras["value"], learner.net.value(obs).detach().numpy(), rtol=1e-5, atol=1e-6)

    disc = PPOLearner(cfg, obs_space, gym.spaces.Discrete(3), device="cpu", seed=1)
    logits = disc.net.actor(obs)
    cat = torch.distributions.Categorical(logits=logits)
    a = torch.tensor([0, 1, 2, 1, 0])
    logp, entropy, _ = disc.net.evaluate(obs, a)
    torch.testing.assert_close(logp, cat.log_prob(a))
    torch.testing.assert_close(entropy, cat.entropy())
    assert entropy.mean().item() == pytest.approx(math.log(3), abs=1e-3)  # head gain 0.01: near uniform


def test_vtrace_gae_by_hand() -> None:
    """V-trace with lambda: rho weighs each delta and each trace; all ones is GAE."""
    g, lam = 0.9, 0.5
    rewards, values = np.array([[1.0, 2.0]]), np.array([[0.5, 1.0]])
    next_values, none = np.array([[1.0, 1.5]]), np.zeros((1, 2), bool)
    rho = np.array([[0.5, 0.8]])
    adv, ret = gae(rewards, values, next_values, none, none, g, lam, rho)
    d0, d1 = 1.0 + 0.9 * 1.0 - 0.5, 2.0 + 0.9 * 1.5 - 1.0
    a1 = 0.8 * d1  # v_1 - V(x_1)
    a0 = 0.5 * (d0 + 0.45 * a1)  # rho_0 on the delta and on the trace
    np.testing.assert_allclose(adv, [[a0, a1]])
    np.testing.assert_allclose(ret, [[a0 + 0.5, a1 + 1.0]])
    np.testing.assert_allclose(gae(rewards, values, next_values, none, none, g, lam, np.ones((1, 2))),
                               gae(rewards, values, next_values, none, none, g, lam))


def test_weighted_surrogate_and_behaviour_weights_by_hand() -> None:
    ratio = torch.tensor([1.5, 0.5])
    adv = torch.tensor([1.0, 1.0])
    # rows: min(1.5, 1.2) * 1 = 1.2 and min(0.5, 0.8) = 0.5, weighted 0.5 and 1
    assert clipped_surrogate(ratio, adv, 0.2, torch.tensor([0.5, 1.0])).item() == pytest.approx(-(0.6 + 0.5) / 2)
    prox, behaviour = torch.log(torch.tensor([0.2, 0.6, 0.5])), torch.log(torch.tensor([0.4, 0.3, 0.5]))
    torch.testing.assert_close(behaviour_weights(prox, behaviour, 1.0), torch.tensor([0.5, 1.0, 1.0]))
    torch.testing.assert_close(behaviour_weights(prox, behaviour, 3.0), torch.tensor([0.5, 2.0, 1.0]))


def stale_segment() -> dict[str, np.ndarray]:
    """One segment of 4 steps whose behaviour log-probs are far from any fresh policy's."""
    return {
        "obs": np.arange(8, dtype=np.float32).reshape(1, 4, 2) / 8, "action": np.array([[0, 1, 1, 0]]),
        "reward": np.ones((1, 4), np.float32), "terminated": np.zeros((1, 4), bool),
        "truncated": np.zeros((1, 4), bool), "final_obs": np.zeros((1, 4, 2), np.float32),
        "bootstrap_obs": np.zeros((1, 2), np.float32), "logp": np.log(np.array([[0.9, 0.1, 0.5, 0.2]], np.float32)),
    }


def test_proximal_clip_takes_the_ratio_to_the_learn_calls_policy_and_weighs_by_the_behaviours() -> None:
    """Decoupled PPO: the first minibatch's ratio is 1 whatever the segment's staleness (nothing clipped), and
    each row weighs min(pi_prox / pi_behaviour, 1); off, the ratio is to the behaviour policy."""
    space = gym.spaces.Box(-1, 1, (2,), np.float32)
    cfg = PPOConfig(hidden=[8], segment_length=4, batch_segments=1, minibatch_size=4, epochs=1)
    learner = PPOLearner(cfg, space, gym.spaces.Discrete(2), device="cpu")
    rows = learner.prepare(stale_segment())
    with torch.no_grad():
        prox, _, _ = learner.net.evaluate(rows["obs"], rows["action"])
    torch.testing.assert_close(rows["logp"], prox)
    behaviour = torch.log(torch.tensor([0.9, 0.1, 0.5, 0.2]))
    torch.testing.assert_close(rows["weight"], (prox - behaviour).exp().clamp(max=1.0))
    assert 0 < float(rows["weight"].min()) < 1 and float(rows["weight"].max()) == 1.0
    _, figures, _ = learner.compute_gradients(rows)
    assert figures["clip_fraction"] == 0.0 and abs(figures["approx_kl"]) < 1e-6
    assert learner.behaviour["behaviour_kl"] == pytest.approx(float((behaviour - prox).mean()), rel=1e-5)

    plain = PPOLearner(cfg.model_copy(update={"proximal_clip": False}), space, gym.spaces.Discrete(2), device="cpu")
    rows = plain.prepare(stale_segment())
    torch.testing.assert_close(rows["logp"], behaviour)
    torch.testing.assert_close(rows["weight"], torch.ones(4))
    _, figures, _ = plain.compute_gradients(rows)
    assert figures["clip_fraction"] > 0  # a ratio of ~0.5/0.9 or ~0.5/0.1 is outside 1 +- 0.2


def test_learner_gae_bootstraps_truncation_from_final_obs() -> None:
    """One segment through prepare(): the truncated step's target uses V(final_obs)."""
    cfg = PPOConfig(hidden=[4], segment_length=3, batch_segments=1, minibatch_size=3, gamma=0.5, gae_lambda=1.0,
                    normalize_advantage=False, vtrace=False)  # the behaviour log-probs below are not the policy's
    space = gym.spaces.Box(-5, 5, (1,), np.float32)
    learner = PPOLearner(cfg, space, gym.spaces.Discrete(2), device="cpu")
    batch = {
        "obs": np.array([[[0.0], [1.0], [2.0]]], np.float32),
        "action": np.array([[0, 1, 0]]), "reward": np.array([[1.0, 1.0, 1.0]], np.float32),
        "terminated": np.array([[False, False, False]]), "truncated": np.array([[True, False, False]]),
        "final_obs": np.array([[[4.0], [0.0], [0.0]]], np.float32), "bootstrap_obs": np.array([[3.0]], np.float32),
        "logp": np.zeros((1, 3), np.float32), "value": np.zeros((1, 3), np.float32),
    }
    rows = learner.prepare(batch)
    with torch.no_grad():
        v = learner.net.value(torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0]])).numpy()
    a2 = 1 + 0.5 * v[3] - v[2]
    a1 = 1 + 0.5 * v[2] - v[1] + 0.5 * a2
    a0 = 1 + 0.5 * v[4] - v[0]  # truncated: V(final obs), and the trace stops
    np.testing.assert_allclose(rows["advantage"].numpy(), [a0, a1, a2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rows["old_value"].numpy(), v[:3], rtol=1e-6)


def test_state_round_trip_and_obs_norm(tmp_path: Path) -> None:
    cfg = PPOConfig(hidden=[8], segment_length=4, batch_segments=2, minibatch_size=4, obs_norm=True,
                    anneal_lr=True, anneal_env_steps=100)
    space = gym.spaces.Box(-50, 50, (2,), np.float32)
    rng = np.random.default_rng(0)

    def batch() -> dict[str, np.ndarray]:
        return {"obs": rng.normal(5, 3, (2, 4, 2)).astype(np.float32), "action": rng.integers(2, size=(2, 4)),
                "reward": rng.normal(size=(2, 4)).astype(np.float32), "terminated": rng.random((2, 4)) < 0.2,
                "truncated": np.zeros((2, 4), bool), "final_obs": np.zeros((2, 4, 2), np.float32),
                "bootstrap_obs": rng.normal(size=(2, 2)).astype(np.float32),
                "logp": np.full((2, 4), -0.69, np.float32), "value": np.zeros((2, 4), np.float32)}

    batches = [batch() for _ in range(4)]
    first = PPOLearner(cfg, space, gym.spaces.Discrete(2), device="cpu", seed=2)
    for b in batches[:2]:
        first.learn(b)
    weights = first.weights()
    assert weights["obs_norm.mean"] == pytest.approx(np.full(2, 5.0), abs=1.5)
    assert {"obs_norm.mean", "obs_norm.var", "obs_norm.count"} <= set(weights)
    policy = PPOPolicy(cfg, space, gym.spaces.Discrete(2))
    policy.load_weights(weights)
    with pytest.raises(ValueError, match="missing"):
        policy.load_weights({k: v for k, v in weights.items() if k != "obs_norm.var"})
    path = tmp_path / "ppo.pt"
    torch.save(first.state(), path)
    second = PPOLearner(cfg, space, gym.spaces.Discrete(2), device="cpu", seed=9)
    second.load_state(torch.load(path, weights_only=True))
    for b in batches[2:]:
        assert first.learn(b) == second.learn(b)
    assert first.env_steps == second.env_steps == 32 and first.learn(batches[0])[0]["lr"] < cfg.lr
    with pytest.raises(ValueError, match="not a PPO checkpoint"):
        second.load_state({"algorithm": "dqn"})
