"""Our PPO update is Stable-Baselines3's, to float precision, on the same weights, data and minibatch order.

The suite compares the serial runner with SB3's PPO in env steps to solve (docs/results.md); a gap there is
either seed noise or a difference in the algorithm. This pins the algorithm: one learn call of PPOLearner and
one ``PPO.train()`` of SB3 (the zoo's LunarLander settings: gamma 0.999, gae_lambda 0.98, ent_coef 0.01, 2
segments of 64 steps, minibatches of 64, 2 epochs) start from the same actor and critic weights, take a
rollout with terminations and truncations (SB3's rollout loop folds gamma * V(final obs) into a truncated
step's reward; our learner bootstraps from ``final_obs``), see the minibatches in the same order, and must
end with the same advantages and the same weights (GAE, per-minibatch advantage normalisation, clipped
surrogate, unclipped value loss at vf_coef 0.5, entropy, grad-norm clip 0.5, Adam with eps 1e-5).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3 import PPO  # a dev dependency (pyproject.toml), as the benches' peers
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv

from harness.sb3_match import PPO_MODULES, Still, copy_into_sb3
from rlfleet.common.algorithms.ppo.config import PPOConfig
from rlfleet.common.algorithms.ppo.learner import PPOLearner

SEGMENTS, STEPS, MINIBATCH, EPOCHS = 2, 64, 64, 2
GAMMA, LAMBDA, ENT = 0.999, 0.98, 0.01
MODULES = PPO_MODULES


class SharedOrder:
    """The minibatch order of each epoch, the same for both sides (``permutation(n)`` as numpy's)."""

    def __init__(self) -> None:
        self.orders = [np.random.default_rng(10 + e).permutation(SEGMENTS * STEPS) for e in range(EPOCHS)]
        self.calls = 0

    def permutation(self, n: int) -> np.ndarray:
        assert n == SEGMENTS * STEPS, n
        order = self.orders[self.calls % EPOCHS]
        self.calls += 1
        return order


def test_one_learn_call_matches_sb3_ppo_train(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    cfg = PPOConfig(segment_length=STEPS, batch_segments=SEGMENTS, minibatch_size=MINIBATCH, epochs=EPOCHS,
                    gamma=GAMMA, gae_lambda=LAMBDA, ent_coef=ENT)
    ours = PPOLearner(cfg, Still.observation_space, Still.action_space, device="cpu", seed=3)
    theirs = PPO("MlpPolicy", DummyVecEnv([Still] * SEGMENTS), n_steps=STEPS, batch_size=MINIBATCH,
                 n_epochs=EPOCHS, gamma=GAMMA, gae_lambda=LAMBDA, ent_coef=ENT, device="cpu", seed=0)
    theirs.set_logger(configure(None, []))
    policy = theirs.policy
    start = ours.weights()
    copy_into_sb3(policy, start, MODULES)

    rng = np.random.default_rng(1)
    obs = rng.normal(size=(SEGMENTS, STEPS, 8)).astype(np.float32)
    action = rng.integers(0, 4, (SEGMENTS, STEPS))
    reward = (rng.normal(size=(SEGMENTS, STEPS)) * 10).astype(np.float32)
    terminated = rng.random((SEGMENTS, STEPS)) < 0.05
    truncated = (rng.random((SEGMENTS, STEPS)) < 0.05) & ~terminated
    assert terminated.any() and truncated.any()
    final_obs = np.where(truncated[..., None], rng.normal(size=(SEGMENTS, STEPS, 8)), 0).astype(np.float32)
    bootstrap_obs = rng.normal(size=(SEGMENTS, 8)).astype(np.float32)
    with torch.no_grad():
        value, logp, _ = policy.evaluate_actions(torch.as_tensor(obs.reshape(-1, 8)),
                                                 torch.as_tensor(action.reshape(-1)))
        value_final = policy.predict_values(torch.as_tensor(final_obs.reshape(-1, 8))).numpy().reshape(SEGMENTS, STEPS)
        value_boot = policy.predict_values(torch.as_tensor(bootstrap_obs)).flatten()
    value = value.numpy().reshape(SEGMENTS, STEPS)
    logp = logp.numpy().reshape(SEGMENTS, STEPS)

    # SB3's side: its rollout buffer filled as its collect_rollouts does (time-major, truncation folded in)
    buffer = theirs.rollout_buffer
    buffer.reset()
    done = terminated | truncated
    for t in range(STEPS):
        step_reward = reward[:, t] + np.where(truncated[:, t], GAMMA * value_final[:, t], 0.0)
        episode_start = np.zeros(SEGMENTS) if t == 0 else done[:, t - 1].astype(np.float32)
        buffer.add(obs[:, t], action[:, t].reshape(-1, 1), step_reward.astype(np.float32), episode_start,
                   torch.as_tensor(value[:, t]), torch.as_tensor(logp[:, t]))
    buffer.compute_returns_and_advantage(last_values=value_boot, dones=done[:, -1])
    sb3_advantage = buffer.advantages.T.reshape(-1)  # (steps, envs) -> env-major, as SB3's get() flattens

    batch = {"obs": obs, "action": action, "reward": reward, "terminated": terminated, "truncated": truncated,
             "final_obs": final_obs, "logp": logp, "value": value, "bootstrap_obs": bootstrap_obs,
             "version": np.zeros(SEGMENTS, np.int64)}
    rows = ours.prepare(batch)
    np.testing.assert_allclose(rows["advantage"].numpy(), sb3_advantage, rtol=1e-4, atol=1e-4)
    # fresh data: the decoupled clip's behaviour weights are 1, so this is plain PPO
    np.testing.assert_allclose(rows["weight"].numpy(), 1.0, atol=1e-5)

    order = SharedOrder()
    monkeypatch.setattr(np.random, "permutation", order.permutation)  # SB3's RolloutBuffer.get()
    theirs.train()
    order.calls = 0
    ours.rng = order  # type: ignore[assignment]
    ours.learn(batch)
    assert order.calls == EPOCHS

    end = ours.weights()
    with torch.no_grad():
        for module, name in MODULES.items():
            layer = policy.get_submodule(module)
            moved = np.abs(end[f"{name}.weight"] - start[f"{name}.weight"]).max()
            assert moved > 1e-4, f"{name} did not move: the comparison would prove nothing"
            np.testing.assert_allclose(layer.weight.numpy(), end[f"{name}.weight"], atol=1e-6,
                                       err_msg=f"{name}.weight after one learn call")
            np.testing.assert_allclose(layer.bias.numpy(), end[f"{name}.bias"], atol=1e-6,
                                       err_msg=f"{name}.bias after one learn call")
