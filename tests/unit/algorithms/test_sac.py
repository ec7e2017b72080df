"""SAC's pieces: actions inside asymmetric bounds, the squashed Gaussian's log-prob, the
temperature's direction, a checkpoint that continues the same run, and its bad configs
refused by `rlfleet up` before any service starts."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from harness.fleet_helpers import CONFIGS, rlfleet
from rlfleet.common.algorithms.sac.config import SACConfig
from rlfleet.common.algorithms.sac.learner import SACLearner
from rlfleet.common.algorithms.sac.networks import squashed_sample
from rlfleet.common.algorithms.sac.policy import SACPolicy

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
LOPSIDED = gym.spaces.Box(np.array([-3.0, 0.5], np.float32), np.array([1.0, 2.0], np.float32))


def batch(n: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    low, high = LOPSIDED.low, LOPSIDED.high
    return {"obs": rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            "action": rng.uniform(low, high, (n, 2)).astype(np.float32),
            "reward": rng.normal(size=n).astype(np.float32), "next_obs": rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            "discount": np.full(n, 0.99, np.float32)}


def test_actions_stay_inside_asymmetric_bounds_in_every_mode() -> None:
    cfg = SACConfig(hidden=[16], learning_starts=10, log_std_max=2.0)
    policy = SACPolicy(cfg, OBS, LOPSIDED, seed=0)
    learner = SACLearner(cfg, OBS, LOPSIDED, device="cpu", seed=0)
    with torch.no_grad():  # a wide, off-centre policy: tanh saturates at both ends
        for p in learner.nets.actor.parameters():
            p.mul_(40.0)
    policy.load_weights(learner.weights())
    obs = np.random.default_rng(1).uniform(-1, 1, (500, 3)).astype(np.float32)
    assert policy.explore(0, 2, 0) == {"warmup_steps_left": 10.0}
    warm, _ = policy.act(obs)
    assert policy.explore(0, 2, 10) == {"warmup_steps_left": 0.0}
    for actions in (warm, policy.act(obs)[0], policy.act(obs, deterministic=True)[0]):
        assert actions.dtype == np.float32 and actions.shape == (500, 2)
        assert all(LOPSIDED.contains(a) for a in actions)
    # the warm-up is uniform over the box: both ends of the lopsided first dimension are reached
    assert warm[:, 0].min() < -2.5 and warm[:, 0].max() > 0.5
    # deterministic acting is tanh(mean): the same actions every call
    np.testing.assert_array_equal(policy.act(obs, deterministic=True)[0], policy.act(obs, deterministic=True)[0])


def test_squashed_log_prob_matches_change_of_variables() -> None:
    mean, log_std = torch.tensor([[0.3, -1.0]]), torch.tensor([[-0.5, 0.2]])
    eps = torch.tensor([[0.7, -1.3]])
    a, logp = squashed_sample(mean, log_std, eps)
    u = mean + log_std.exp() * eps
    base = torch.distributions.Normal(mean, log_std.exp()).log_prob(u).sum(1)
    want = base - torch.log(1 - torch.tanh(u).pow(2)).sum(1)
    torch.testing.assert_close(a, torch.tanh(u))
    torch.testing.assert_close(logp, want)


def test_temperature_falls_while_entropy_is_above_target() -> None:
    cfg = SACConfig(hidden=[16], critic_hidden=[16], lr=1e-2)
    learner = SACLearner(cfg, OBS, LOPSIDED, device="cpu", seed=0)
    start = float(learner.log_alpha.detach())
    for _ in range(20):
        figures, priorities = learner.learn(batch())
    assert float(learner.log_alpha.detach()) < start  # a fresh policy's entropy is well above -|A| = -2
    assert set(figures) == {"critic_loss", "actor_loss", "alpha", "entropy", "q_mean"}
    assert priorities.shape == (32,) and (priorities > 0).all()
    fixed = SACLearner(SACConfig(hidden=[16], ent_coef=0.2), OBS, LOPSIDED, device="cpu", seed=0)
    fixed.learn(batch())
    assert float(fixed.log_alpha.exp()) == pytest.approx(0.2) and "alpha" not in fixed.optimizers


def test_checkpoint_continues_the_same_run(tmp_path: Path) -> None:
    cfg = SACConfig(hidden=[16], critic_hidden=[16])
    a = SACLearner(cfg, OBS, LOPSIDED, device="cpu", seed=0)
    for i in range(5):
        a.learn(batch(seed=i))
    path = tmp_path / "sac.pt"
    torch.save(a.state(), path)
    b = SACLearner(cfg, OBS, LOPSIDED, device="cpu", seed=7)  # another seed: everything must come from the file
    b.load_state(torch.load(path, weights_only=True))
    assert b.num_updates == 5 and float(b.log_alpha.detach()) == pytest.approx(float(a.log_alpha.detach()))
    for i in range(5, 8):  # optimizer moments, targets and the sampling generator all restored
        fa, pa = a.learn(batch(seed=i))
        fb, pb = b.learn(batch(seed=i))
        assert fa == pytest.approx(fb) and pa == pytest.approx(pb)
    for x, y in zip(a.nets.parameters(), b.nets.parameters(), strict=True):
        torch.testing.assert_close(x, y)
    with pytest.raises(ValueError, match="not a SAC checkpoint"):
        b.load_state({"algorithm": "dqn", "format": 1})


QUEUE = "replay.tables=[{name: main, kind: queue, capacity: 1000, min_size: 1}]"
ALLOWED_BOX = "allowed: Box actions with finite low < high in every dimension"
REFUSALS = {
    "a discrete env": (["--set", "env.id=CartPole-v1"], ["algorithm sac needs continuous actions", "Discrete(2)",
                                                         ALLOWED_BOX]),
    "a queue table": (["--set", QUEUE], ["replay.tables[main].kind='queue'", "allowed: uniform, prioritized"]),
    "infinite bounds": (["--set", "env.id=harness.toy_envs:UnboundedReach"], ["Box(-inf, inf", "infinite bounds",
                                                                            ALLOWED_BOX]),
    "target entropy not a number": (["--set", "algorithm.target_entropy=abc"],
                                    ["algorithm.target_entropy", "'abc'", "valid number", "'auto'"]),
    "unknown option": (["--set", "algorithm.taw=0.1"], ["algorithm.taw: unknown field", "tau"]),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_up_refuses_before_starting(case: str, tmp_path: Path) -> None:
    args, words = REFUSALS[case]
    res = rlfleet("up", "--config", str(CONFIGS / "pendulum-sac.yaml"), "--runs", str(tmp_path / "runs"), *args,
                  timeout=120)
    assert res.returncode == 2, f"exit {res.returncode}:\n{res.stdout[-3000:]}"
    assert "Traceback" not in res.stdout, res.stdout
    for word in words:
        assert word in res.stdout, (word, res.stdout)
    assert not (tmp_path / "runs").exists(), "a run directory was made for a refused config"


def test_a_bfloat16_update_keeps_heads_losses_and_weights_float32_and_close_to_float32() -> None:
    from rlfleet.common.algorithms.device import native_bfloat16

    b = batch(64, seed=3)
    b["reward"] = b["reward"] * 50  # Q-targets of tens: where a bfloat16 head would round
    results = {}
    for dtype in ("float32", "bfloat16"):
        learner = SACLearner(SACConfig(hidden=[32, 32], update_dtype=dtype), OBS, LOPSIDED, device="cpu", seed=5)
        assert learner.bf16 == (dtype == "bfloat16")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=learner.bf16):
            q1, _ = learner.nets.q(learner.nets.critic, torch.zeros(4, 3), torch.zeros(4, 2))
            mean, _ = learner.nets.mean_log_std(torch.zeros(4, 3))
        assert q1.dtype == mean.dtype == torch.float32
        results[dtype] = learner.compute_gradients(b)
        learner.apply_gradients(results[dtype][0])
        assert all(p.dtype == torch.float32 for p in learner.nets.parameters())
        assert {k.split(".")[0] for k in learner.nets.state_dict()} == {"actor", "critic", "critic_target"}
    (g32, f32, p32), (g16, f16, p16) = results["float32"], results["bfloat16"]
    for name in g32:
        diff = torch.cat([(a - c).flatten() for a, c in zip(g32[name], g16[name], strict=True)]).norm()
        assert all(g.dtype == torch.float32 for g in g16[name])
        assert float(diff) <= 0.1 * float(torch.cat([a.flatten() for a in g32[name]]).norm()) + 1e-6, name
    assert f16["critic_loss"] == pytest.approx(f32["critic_loss"], rel=0.02)
    np.testing.assert_allclose(p16, p32, rtol=0.05, atol=0.05)
    auto = SACLearner(SACConfig(hidden=[8], update_dtype="auto"), OBS, LOPSIDED, device="cpu")
    assert auto.bf16 == native_bfloat16(torch.device("cpu"))
