"""SAC's losses, gradients, priorities and figures against the formulas of its module docstring,
computed here from the learner's own networks and the same noise (what mutation testing found
unchecked: docs/testing.md)."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.common.algorithms.sac.config import SACConfig
from rlfleet.common.algorithms.sac.learner import PRIORITY_EPS, SACLearner
from rlfleet.common.algorithms.sac.networks import squashed_sample

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = gym.spaces.Box(np.array([-3.0, 0.5], np.float32), np.array([1.0, 2.0], np.float32))
N = 6


def batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"obs": rng.uniform(-1, 1, (N, 3)).astype(np.float32),
            "action": rng.uniform(ACTIONS.low, ACTIONS.high, (N, 2)).astype(np.float32),
            "reward": rng.normal(size=N).astype(np.float32),
            "next_obs": rng.uniform(-1, 1, (N, 3)).astype(np.float32),
            "discount": np.array([0.99, 0.0, 0.5, 0.99, 0.9, 0.99], np.float32)}


def learner(ent_coef: str | float) -> SACLearner:
    cfg = SACConfig(hidden=[16], critic_hidden=[16], ent_coef=ent_coef, ent_coef_init=0.3)
    sac = SACLearner(cfg, OBS, ACTIONS, device="cpu", seed=4)
    with torch.no_grad():  # targets apart from the critics, so that mixing them up shows
        for p in sac.nets.critic_target.parameters():
            p.mul_(0.7).add_(0.05)
    return sac


def by_hand(sac: SACLearner, b: dict[str, np.ndarray], weights: np.ndarray | None,
            noise_state: torch.Tensor) -> dict[str, Any]:
    """The docstring's y, critics, actor and alpha terms, the gradients of each, and the priorities."""
    obs, next_obs = torch.as_tensor(b["obs"]), torch.as_tensor(b["next_obs"])
    action = sac.scale.to_unit(torch.as_tensor(b["action"]))
    gen = torch.Generator().manual_seed(0)
    gen.set_state(noise_state)
    both = torch.cat([obs, next_obs])
    mean, log_std = sac.nets.mean_log_std(both)
    a, logp = squashed_sample(mean, log_std, torch.randn(mean.shape, generator=gen))
    alpha = float(sac.log_alpha.detach().exp())
    with torch.no_grad():
        q1t, q2t = sac.nets.q(sac.nets.critic_target, next_obs, a[N:])
        y = torch.as_tensor(b["reward"]) + torch.as_tensor(b["discount"]) * (torch.min(q1t, q2t) - alpha * logp[N:])
    q1, q2 = sac.nets.q(sac.nets.critic, obs, action)
    w = torch.ones(N) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
    critic = 0.5 * ((w * (q1 - y) ** 2).mean() + (w * (q2 - y) ** 2).mean())
    critic_params = list(sac.nets.critic.parameters())
    actor_params = list(sac.nets.actor.parameters())
    critic_grads = torch.autograd.grad(critic, critic_params, retain_graph=True)
    q1_pi, q2_pi = sac.nets.q(sac.nets.critic, obs, a[:N])
    actor = (alpha * logp[:N] - torch.min(q1_pi, q2_pi)).mean()
    actor_grads = torch.autograd.grad(actor, actor_params)
    entropy = float(-logp[:N].detach().mean())
    return {"critic_loss": float(critic.detach()), "actor_loss": float(actor.detach()), "alpha": alpha,
            "entropy": entropy, "q_mean": float(q1.detach().mean()), "critic": critic_grads, "actor": actor_grads,
            "alpha_grad": entropy - sac.target_entropy,
            "td": (0.5 * ((q1 - y).abs() + (q2 - y).abs())).detach().double().numpy()}


@pytest.mark.parametrize("weighted", [False, True])
def test_every_loss_gradient_and_priority_is_the_docstrings_formula(weighted: bool) -> None:
    sac = learner("auto")
    b = batch()
    weights = np.array([0.2, 1.0, 0.5, 0.7, 1.0, 0.1], np.float32) if weighted else None
    want = by_hand(sac, b, weights, sac.gen.get_state())
    grads, figures, priorities = sac.compute_gradients(b, weights)
    assert set(grads) == {"critic", "actor", "alpha"}
    for name in ("critic_loss", "actor_loss", "alpha", "entropy", "q_mean"):
        assert figures[name] == pytest.approx(want[name], rel=1e-5, abs=1e-6), name
    for got, ref in zip(grads["critic"], want["critic"], strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-6)
    for got, ref in zip(grads["actor"], want["actor"], strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-6)
    assert grads["alpha"][0].shape == sac.log_alpha.shape
    assert float(grads["alpha"][0]) == pytest.approx(want["alpha_grad"], rel=1e-5)
    np.testing.assert_allclose(priorities, want["td"] + PRIORITY_EPS, rtol=1e-5)
    # PRIORITY_EPS is added, not taken away: no priority is zero even where both critics hit the target
    assert (priorities - want["td"]).mean() == pytest.approx(PRIORITY_EPS, abs=3e-7)
    assert priorities.dtype == np.float64 and priorities.shape == (N,)


def test_a_fixed_temperature_has_no_alpha_gradient_and_enters_the_target_and_the_actor() -> None:
    sac = learner(0.2)
    b = batch()
    want = by_hand(sac, b, None, sac.gen.get_state())
    grads, figures, _ = sac.compute_gradients(b)
    assert set(grads) == {"critic", "actor"}
    assert figures["alpha"] == pytest.approx(0.2) and want["alpha"] == pytest.approx(0.2)
    assert figures["critic_loss"] == pytest.approx(want["critic_loss"], rel=1e-5)
    assert figures["actor_loss"] == pytest.approx(want["actor_loss"], rel=1e-5)


def test_target_critics_follow_by_polyak_tau() -> None:
    sac = learner("auto")
    before = [p.detach().clone() for p in sac.nets.critic_target.parameters()]
    critic = [p.detach().clone() for p in sac.nets.critic.parameters()]
    sac.after_update({"critic", "actor"})
    tau = sac.cfg.tau
    assert 0 < tau < 1 and not math.isclose(tau, 0.5)
    for got, old, new in zip(sac.nets.critic_target.parameters(), before, critic, strict=True):
        torch.testing.assert_close(got.detach(), old + tau * (new - old))
