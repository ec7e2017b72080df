"""The DQN learner's update: double-Q targets and heads by hand, compute/apply against a plain
autograd update with clip_grad_norm_, the target network, seeding."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from harness.dqn_helpers import ACT_SPACE, OBS_SPACE, random_batch
from rlfleet.common.algorithms.dqn.config import DQNConfig
from rlfleet.common.algorithms.dqn.learner import DQNLearner
from rlfleet.common.algorithms.dqn.networks import n_step_target
from rlfleet.common.algorithms.dqn.policy import DQNPolicy


def linear_learner(**overrides: Any) -> DQNLearner:
    """Q(s) = W s: a linear net whose numbers can be checked by hand."""
    cfg = DQNConfig(hidden=[], dueling=False, huber_delta=1.0, priority_eps=1e-3, **overrides)
    space = gym.spaces.Box(-10, 10, (2,), np.float32)
    learner = DQNLearner(cfg, space, gym.spaces.Discrete(2), device="cpu")
    with torch.no_grad():
        learner.online.head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        learner.target.head.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 3.0]]))
        learner.online.head.bias.zero_()
        learner.target.head.bias.zero_()
    return learner


HAND_BATCH = {
    "obs": np.array([[1.0, 2.0], [0.0, 1.0]], np.float32),
    "action": np.array([1, 0], np.int64),
    "reward": np.array([0.5, 1.0], np.float32),
    "next_obs": np.array([[3.0, 2.5], [5.0, 5.0]], np.float32),
    "discount": np.array([0.9, 0.0], np.float32),
}


def test_double_q_target_by_hand() -> None:
    # online(next) = [3, 2.5] -> a* = 0; target(next) = [6, 7.5]
    reward, discount = torch.tensor([0.5]), torch.tensor([0.9])
    online, target = torch.tensor([[3.0, 2.5]]), torch.tensor([[6.0, 7.5]])
    assert n_step_target(reward, discount, online, target, double=True).item() == pytest.approx(5.9)
    assert n_step_target(reward, discount, online, target, double=False).item() == pytest.approx(7.25)

    learner = linear_learner()
    metrics, priorities = learner.learn(HAND_BATCH, np.array([0.5, 1.0], np.float32))
    # Q(s, a): 2 and 0; targets 5.9 and 1 (terminal); Huber: 3.9 -> 3.4, 1 -> 0.5
    assert priorities.dtype == np.float64
    np.testing.assert_allclose(priorities, [3.901, 1.001], rtol=1e-6)
    assert metrics["loss"] == pytest.approx((0.5 * 3.4 + 0.5) / 2)
    assert metrics["q_mean"] == pytest.approx(1.0)
    assert metrics["td_abs_mean"] == pytest.approx(2.45)

    plain = linear_learner(double=False)
    _, priorities = plain.learn(HAND_BATCH)
    np.testing.assert_allclose(priorities, [5.25 + 1e-3, 1.001], rtol=1e-6)


def test_actor_priorities_bootstrap_from_online_max() -> None:
    learner = linear_learner()
    policy = DQNPolicy(learner.cfg, gym.spaces.Box(-10, 10, (2,), np.float32), gym.spaces.Discrete(2))
    policy.load_weights(learner.weights())
    # online only: 0.5 + 0.9 * max(3, 2.5) - 2 = 1.2
    np.testing.assert_allclose(policy.priorities(HAND_BATCH), [1.201, 1.001], rtol=1e-6)


def test_dueling_head_identity() -> None:
    policy = DQNPolicy(DQNConfig(hidden=[16]), OBS_SPACE, ACT_SPACE, seed=3)
    net = policy.net
    x = torch.randn(5, 4)
    with torch.no_grad():
        q = net(x)
        features = net.torso(x)
        value, advantage = net.value(features), net.advantage(features)
    torch.testing.assert_close(q.mean(dim=1, keepdim=True), value)
    torch.testing.assert_close(q - value, advantage - advantage.mean(dim=1, keepdim=True))


def autograd_update(learner: DQNLearner, adam: torch.optim.Adam, batch: dict[str, np.ndarray],
                    weights: np.ndarray | None) -> None:
    """The Ape-X update written as one loss.backward() and clip_grad_norm_: what DQNLearner.learn must equal."""
    cfg = learner.cfg
    b = {k: torch.as_tensor(v) for k, v in batch.items()}
    q_sa = learner.online(b["obs"]).gather(1, b["action"].long()[:, None]).squeeze(1)
    with torch.no_grad():
        next_target = learner.target(b["next_obs"])
        next_online = learner.online(b["next_obs"]) if cfg.double else next_target
        target = n_step_target(b["reward"].float(), b["discount"].float(), next_online, next_target, cfg.double)
    losses = torch.nn.functional.huber_loss(q_sa, target, reduction="none", delta=cfg.huber_delta)
    if weights is not None:
        losses = losses * torch.as_tensor(weights).float()
    adam.zero_grad(set_to_none=True)
    losses.mean().backward()
    torch.nn.utils.clip_grad_norm_(learner.online.parameters(),
                                   cfg.grad_clip if cfg.grad_clip is not None else float("inf"))
    adam.step()
    learner.num_updates += 1
    learner.follow_target()


@pytest.mark.parametrize("hidden,dueling,grad_clip,weighted", [
    ([32, 16], True, 0.05, True), ([32, 16], False, None, False), ([], True, 10.0, True), ([8], False, 0.05, True),
])
def test_compute_apply_match_plain_autograd(hidden: list[int], dueling: bool, grad_clip: float | None,
                                         weighted: bool) -> None:
    """compute_gradients + apply_gradients take the same steps as the plain autograd update."""
    cfg = DQNConfig(hidden=hidden, dueling=dueling, grad_clip=grad_clip, huber_delta=0.5, lr=1e-2)
    ours = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=4)
    ref = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=4)
    ref_adam = torch.optim.Adam(ref.online.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
    rng = np.random.default_rng(1)
    for _ in range(6):
        batch = random_batch(rng, size=64)
        batch["reward"] *= 5  # TD errors on both sides of the Huber delta
        weights = rng.random(64).astype(np.float32) if weighted else None
        ours.learn(batch, weights)
        autograd_update(ref, ref_adam, batch, weights)
        for (name, a), b in zip(ours.online.named_parameters(), ref.online.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    for a, b in zip(ours.target.parameters(), ref.target.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_target_follows_hard_and_polyak() -> None:
    rng = np.random.default_rng(0)
    hard = DQNLearner(DQNConfig(hidden=[8], target_period=3), OBS_SPACE, ACT_SPACE, device="cpu")
    start = hard.target.state_dict()["value.weight"].clone()
    hard.learn(random_batch(rng))
    hard.learn(random_batch(rng))
    torch.testing.assert_close(hard.target.state_dict()["value.weight"], start)
    hard.learn(random_batch(rng))
    torch.testing.assert_close(hard.target.state_dict()["value.weight"], hard.online.state_dict()["value.weight"])

    soft = DQNLearner(DQNConfig(hidden=[8], target_update="polyak", tau=0.25), OBS_SPACE, ACT_SPACE, device="cpu")
    before = soft.target.state_dict()["value.weight"].clone()
    soft.learn(random_batch(rng))
    after = soft.online.state_dict()["value.weight"]
    torch.testing.assert_close(soft.target.state_dict()["value.weight"], 0.75 * before + 0.25 * after)


def test_same_seed_same_learner() -> None:
    cfg = DQNConfig(hidden=[16])
    a = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=7)
    b = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=7)
    batch = random_batch(np.random.default_rng(0))
    assert a.learn(batch)[0] == b.learn(batch)[0]
    policy = DQNPolicy(cfg, OBS_SPACE, ACT_SPACE, seed=7)  # actors start where the learner starts
    np.testing.assert_array_equal(
        policy.q_values(batch["obs"]), DQNPolicy(cfg, OBS_SPACE, ACT_SPACE, seed=7).q_values(batch["obs"])
    )


@pytest.mark.parametrize("dueling", [True, False])
def test_a_bfloat16_update_keeps_heads_and_weights_float32_and_close_to_float32(dueling: bool) -> None:
    from rlfleet.common.algorithms.device import native_bfloat16

    b = random_batch(np.random.default_rng(4), 128)
    b["reward"] = b["reward"] * 50  # targets of tens: where a bfloat16 head would round to steps of 0.25
    results = {}
    for dtype in ("float32", "bfloat16"):
        learner = DQNLearner(DQNConfig(hidden=[64, 64], dueling=dueling, update_dtype=dtype), OBS_SPACE, ACT_SPACE,
                             device="cpu", seed=5)
        assert learner.bf16 == (dtype == "bfloat16")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=learner.bf16):
            assert learner.online(torch.zeros(3, 4)).dtype == torch.float32
        results[dtype] = learner.compute_gradients(b)
        learner.apply_gradients(results[dtype][0])
        assert all(p.dtype == torch.float32 for p in learner.online.parameters())
        assert all(p.dtype == torch.float32 for p in learner.target.parameters())
    (g32, f32, p32), (g16, f16, p16) = results["float32"], results["bfloat16"]
    assert all(g.dtype == torch.float32 for g in g16["q"])
    diff = torch.cat([(a - c).flatten() for a, c in zip(g32["q"], g16["q"], strict=True)]).norm()
    assert 0 < float(diff) <= 0.1 * float(torch.cat([a.flatten() for a in g32["q"]]).norm())  # bf16 indeed, close
    assert f16["loss"] == pytest.approx(f32["loss"], rel=0.02)
    np.testing.assert_allclose(p16, p32, rtol=0.05, atol=0.05)
    auto = DQNLearner(DQNConfig(hidden=[8], update_dtype="auto"), OBS_SPACE, ACT_SPACE, device="cpu")
    assert auto.bf16 == native_bfloat16(torch.device("cpu"))
