"""DQN weights and checkpoints: the learner's weights into a policy, its state through torch.save
and the atomic checkpoint helper."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.dqn_helpers import ACT_SPACE, OBS_SPACE, random_batch
from rlfleet.common.algorithms.checkpoint import load_checkpoint, save_checkpoint
from rlfleet.common.algorithms.dqn.config import DQNConfig
from rlfleet.common.algorithms.dqn.learner import DQNLearner
from rlfleet.common.algorithms.dqn.policy import DQNPolicy


def test_weights_round_trip_gives_identical_q_values() -> None:
    cfg = DQNConfig(hidden=[32, 32])
    learner = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=1)
    rng = np.random.default_rng(0)
    for _ in range(5):
        learner.learn(random_batch(rng))
    policy = DQNPolicy(cfg, OBS_SPACE, ACT_SPACE, seed=2)
    weights = learner.weights()
    assert all(w.dtype == np.float32 and w.flags.c_contiguous for w in weights.values())
    assert set(weights) == set(learner.online.state_dict())
    # As they arrive from the wire: read-only views of bytes.
    wire = {k: np.frombuffer(v.tobytes(), np.float32).reshape(v.shape) for k, v in weights.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy.load_weights(wire)
    obs = rng.normal(size=(16, 4)).astype(np.float32)
    with torch.no_grad():
        expected = learner.online(torch.from_numpy(obs)).numpy()
    np.testing.assert_array_equal(policy.net(torch.from_numpy(obs)).detach().numpy(), expected)
    # q_values of a few rows go through numpy (dueling head folded): equal to float32 rounding
    np.testing.assert_allclose(policy.q_values(obs), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(policy.q_values(obs).argmax(axis=1), expected.argmax(axis=1))

    weights["torso.0.weight"][:] = 0  # a copy: the learner is untouched
    assert learner.online.state_dict()["torso.0.weight"].abs().sum() > 0
    bad = dict(wire, **{"value.weight": np.zeros((1, 3), np.float32)})
    with pytest.raises(ValueError, match="value.weight"):
        policy.load_weights(bad)
    with pytest.raises(ValueError, match="missing"):
        policy.load_weights({k: v for k, v in wire.items() if k != "value.bias"})
    np.testing.assert_allclose(policy.q_values(obs), expected, rtol=1e-5, atol=1e-6)  # a refused load changes nothing


def test_state_round_trip_through_torch_save(tmp_path: Path) -> None:
    cfg = DQNConfig(hidden=[32], target_period=3)
    rng = np.random.default_rng(0)
    batches = [random_batch(rng) for _ in range(8)]
    first = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=1)
    for batch in batches[:5]:
        first.learn(batch)
    path = tmp_path / "learner.pt"
    torch.save(first.state(), path)
    second = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=99)
    second.load_state(torch.load(path, weights_only=True))
    # The same through the atomic helper the learner service uses.
    assert load_checkpoint(tmp_path / "none.pt") is None
    save_checkpoint(tmp_path / "sub" / "learner.pt", first.state())
    third = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=98)
    third.load_state(load_checkpoint(tmp_path / "sub" / "learner.pt") or {})
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["learner.pt"]
    assert second.num_updates == 5
    for batch in batches[5:]:  # Adam moments and the target schedule carry on identically
        m1, p1 = first.learn(batch)
        m2, p2 = second.learn(batch)
        m3, p3 = third.learn(batch)
        assert m1 == m2 == m3
        np.testing.assert_array_equal(p1, p2)
        np.testing.assert_array_equal(p1, p3)
    for a, b in zip(first.target.state_dict().values(), second.target.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="not a DQN checkpoint"):
        second.load_state({"algorithm": "sac"})
