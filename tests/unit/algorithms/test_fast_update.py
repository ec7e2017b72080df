"""The learners' fast update paths give what the plain torch ones give.

- ClippedAdam (common/algorithms/optim.py) against clip_grad_norm_ + torch.optim.Adam.
- PPO's TwinMLP (actor and critic hidden layers stacked) against the two nn.Sequential MLPs
  it was built from, and its published layout round-tripping through a policy.
- normalize_chunks against normalize_advantage minibatch by minibatch.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.common.algorithms.mlp import TwinMLP, mlp
from rlfleet.common.algorithms.optim import ClippedAdam
from rlfleet.common.algorithms.ppo.config import PPOConfig
from rlfleet.common.algorithms.ppo.learner import PPOLearner
from rlfleet.common.algorithms.ppo.losses import normalize_advantage, normalize_chunks
from rlfleet.common.algorithms.ppo.policy import PPOPolicy


@pytest.mark.parametrize("max_norm", [0.5, None, 1e6])
def test_clipped_adam_matches_clip_grad_norm_and_adam(max_norm: float | None) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    ref = copy.deepcopy(net)
    fast = ClippedAdam(net.parameters(), lr=1e-3, eps=1e-5)
    plain = torch.optim.Adam(ref.parameters(), lr=1e-3, eps=1e-5)
    for _ in range(20):
        x = torch.randn(16, 6) * 5
        grads = list(torch.autograd.grad(net(x).pow(2).sum(), list(net.parameters())))
        norm = fast.step(grads, max_norm)
        plain.zero_grad()
        ref(x).pow(2).sum().backward()
        if max_norm is not None:
            want = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
            assert norm is not None and float(norm) == pytest.approx(float(want), rel=1e-5)
        plain.step()
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the state is Adam's own: a plain Adam loads it and steps on identically
    assert fast.state_dict()["state"][0]["step"] == 20
    plain.load_state_dict(fast.state_dict())


def test_clipped_adam_lr_and_missing_grads() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    unused = torch.nn.Parameter(torch.ones(2))
    fast = ClippedAdam([w, unused], lr=0.1)
    fast.step([torch.ones(3), None], None, lr=0.01)
    torch.testing.assert_close(w.detach(), torch.full((3,), 0.99))  # Adam's first step moves lr
    torch.testing.assert_close(unused.detach(), torch.ones(2))
    assert fast.param_groups[0]["lr"] == 0.01


@pytest.mark.parametrize("hidden", [[16, 8], []])
def test_twin_mlp_matches_its_two_mlps(hidden: list[int]) -> None:
    torch.manual_seed(1)
    first, second = mlp(5, hidden, 3, "tanh", 0.01), mlp(5, hidden, 1, "tanh", 1.0)
    twin = TwinMLP(copy.deepcopy(first), copy.deepcopy(second), "tanh")
    x = torch.randn(7, 5)
    a, c = twin(x)
    torch.testing.assert_close(a, first(x))
    torch.testing.assert_close(c, second(x))
    torch.testing.assert_close(twin.one(x, 0), first(x))
    torch.testing.assert_close(twin.one(x, 1), second(x))


@pytest.mark.parametrize("space", [gym.spaces.Discrete(4), gym.spaces.Box(-1.0, 2.0, (2,))])
def test_published_layout_round_trips_to_the_policy(space: gym.Space) -> None:
    cfg = PPOConfig(hidden=[16, 16])
    obs_space = gym.spaces.Box(-1.0, 1.0, (5,))
    learner = PPOLearner(cfg, obs_space, space, device="cpu", seed=3)
    with torch.no_grad():  # move away from the policy's own seeded start
        for p in learner.net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    weights = learner.weights()
    assert {"actor.0.weight", "actor.2.weight", "actor.4.bias", "critic.4.weight"} <= set(weights)
    assert weights["actor.0.weight"].shape == (16, 5)  # nn.Linear's [out, in]
    policy = PPOPolicy(cfg, obs_space, space, seed=0)
    policy.load_weights(weights)
    obs = np.random.default_rng(0).uniform(-1, 1, (6, 5)).astype(np.float32)
    _, extras = policy.act(obs, deterministic=True)
    with torch.no_grad():
        want = learner.net.value(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(extras["value"], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"actor\.0\.weight.*shape"):
        policy.load_weights({**weights, "actor.0.weight": np.zeros((16, 4), np.float32)})


@pytest.mark.parametrize("n", [12, 14, 3])
def test_normalize_chunks_is_per_minibatch(n: int) -> None:
    adv = torch.randn(n) * 3 + 1
    got = normalize_chunks(adv, 4)
    want = torch.cat([normalize_advantage(adv[i:i + 4]) for i in range(0, n, 4)])
    torch.testing.assert_close(got, want)


def test_clipped_adam_resumes_from_a_plain_adam_state() -> None:
    torch.manual_seed(2)
    net = torch.nn.Linear(4, 2)
    ref = copy.deepcopy(net)
    plain = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for _ in range(3):
        plain.zero_grad()
        ref(torch.randn(8, 4)).pow(2).sum().backward()
        plain.step()
    net.load_state_dict(ref.state_dict())
    fast = ClippedAdam(net.parameters(), lr=0.5)
    fast.load_state_dict(plain.state_dict())
    assert fast.param_groups[0]["lr"] == 1e-2 and int(fast.state[0]["step"]) == 3
    x = torch.randn(8, 4)
    fast.step(list(torch.autograd.grad(net(x).pow(2).sum(), list(net.parameters()))))
    plain.zero_grad()
    ref(x).pow(2).sum().backward()
    plain.step()
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="one group of 2"):
        ClippedAdam([torch.nn.Parameter(torch.ones(1))] * 2, lr=0.1).load_state_dict(
            {"state": {}, "param_groups": [{"params": [0, 1, 2]}]})


def test_clipped_adam_does_not_import_dynamo() -> None:
    """torch.optim.Adam's constructor imports torch._dynamo (~0.9 s of every learner's start-up)."""
    import subprocess
    import sys

    code = ("import sys, torch; from rlfleet.common.algorithms.optim import ClippedAdam; "
            "a = ClippedAdam(torch.nn.Linear(2, 1).parameters(), lr=0.1); a.step([torch.ones(1, 2), torch.ones(1)]); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_clipped_adam_leaves_a_parameter_without_gradient_alone_as_torch_adam_does() -> None:
    w, unused = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    fast = ClippedAdam([w, unused], lr=0.1, weight_decay=0.5)  # weight decay would move a zero gradient's parameter
    fast.step([torch.ones(3), None])
    torch.testing.assert_close(unused.detach(), torch.ones(2))
    assert int(fast.state[0]["step"]) == 1 and int(fast.state[1]["step"]) == 0
    with pytest.raises(ValueError, match="1 gradients for 2 parameters"):
        fast.step([torch.ones(3)])
