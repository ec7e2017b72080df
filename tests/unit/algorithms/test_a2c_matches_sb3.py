"""Our A2C update (a worker's gradient, the shard's RMSprop) is Stable-Baselines3's, to float precision.

The A3C LunarLander config solves fewer seeds than SB3's A2C with the same (zoo) settings
(docs/benchmarks.md): this pins whether the algorithm is the same. Three updates in a row: each a
rollout of ENVS envs x STEPS steps with terminations and truncations (SB3's rollout loop folds
gamma * V(final obs) into a truncated step's reward; our worker bootstraps from ``final_obs``), the
worker's gradient (n-step returns, policy loss, entropy, value loss at vf_coef 0.5, grad-norm clip 0.5)
applied by the paramserver's SliceTrainer with RMSprop (alpha 0.99, eps 1e-5) against one
``A2C.train()``, from the same weights; after each update every weight must agree.
"""

from __future__ import annotations

import numpy as np
import torch
from stable_baselines3 import A2C  # a dev dependency (pyproject.toml), as the benches' peers
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv

from harness.sb3_match import A3C_MODULES, Still, copy_into_sb3
from rlfleet.common.algorithms.a3c.config import A3CConfig
from rlfleet.common.algorithms.a3c.worker import A3CWorker
from rlfleet.common.config.sections import GradientsConfig
from rlfleet.services.paramserver.gradients import SliceTrainer

ENVS, STEPS, UPDATES = 8, 5, 3
GAMMA, ENT, LR = 0.995, 1e-5, 8.3e-4
MODULES = A3C_MODULES


def rollout(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A worker's segments [ENVS, STEPS] with some terminations and truncations."""
    terminated = rng.random((ENVS, STEPS)) < 0.1
    truncated = (rng.random((ENVS, STEPS)) < 0.1) & ~terminated
    return {"obs": rng.normal(size=(ENVS, STEPS, 8)).astype(np.float32),
            "action": rng.integers(0, 4, (ENVS, STEPS)),
            "reward": (rng.normal(size=(ENVS, STEPS)) * 10).astype(np.float32),
            "terminated": terminated, "truncated": truncated,
            "final_obs": np.where(truncated[..., None], rng.normal(size=(ENVS, STEPS, 8)), 0).astype(np.float32),
            "bootstrap_obs": rng.normal(size=(ENVS, 8)).astype(np.float32)}


def fill_sb3_buffer(model: A2C, items: dict[str, np.ndarray]) -> None:
    """SB3's rollout buffer as its collect_rollouts fills it from these steps (time-major, truncation folded in)."""
    policy = model.policy
    obs, action = items["obs"], items["action"]
    with torch.no_grad():
        value, logp, _ = policy.evaluate_actions(torch.as_tensor(obs.reshape(-1, 8)),
                                                 torch.as_tensor(action.reshape(-1)))
        value_final = policy.predict_values(torch.as_tensor(items["final_obs"].reshape(-1, 8))).numpy()
        value_boot = policy.predict_values(torch.as_tensor(items["bootstrap_obs"])).flatten()
    value = value.numpy().reshape(ENVS, STEPS)
    logp = logp.numpy().reshape(ENVS, STEPS)
    value_final = value_final.reshape(ENVS, STEPS)
    terminated, truncated = items["terminated"], items["truncated"]
    done = terminated | truncated
    buffer = model.rollout_buffer
    buffer.reset()
    for t in range(STEPS):
        reward = items["reward"][:, t] + np.where(truncated[:, t], GAMMA * value_final[:, t], 0.0)
        episode_start = np.zeros(ENVS) if t == 0 else done[:, t - 1].astype(np.float32)
        buffer.add(obs[:, t], action[:, t].reshape(-1, 1), reward.astype(np.float32), episode_start,
                   torch.as_tensor(value[:, t]), torch.as_tensor(logp[:, t]))
    buffer.compute_returns_and_advantage(last_values=value_boot, dones=done[:, -1])


def test_three_updates_match_sb3_a2c_train() -> None:
    torch.manual_seed(0)
    cfg = A3CConfig(n_steps=STEPS, gamma=GAMMA, ent_coef=ENT)
    worker = A3CWorker(cfg, Still.observation_space, Still.action_space, seed=3)
    shard = SliceTrainer(GradientsConfig(optimizer="rmsprop", lr=LR, alpha=0.99, eps=1e-5))
    theirs = A2C("MlpPolicy", DummyVecEnv([Still] * ENVS), n_steps=STEPS, gamma=GAMMA, ent_coef=ENT,
                 learning_rate=LR, device="cpu", seed=0)
    theirs.set_logger(configure(None, []))
    policy = theirs.policy
    start = worker.weights()
    copy_into_sb3(policy, start, MODULES)
    shard.follow(0, start)

    rng = np.random.default_rng(1)
    clipped = 0
    for update in range(UPDATES):
        items = rollout(rng)
        fill_sb3_buffer(theirs, items)
        theirs.train()
        grads, figures = worker.gradients(items)
        clipped += figures["grad_norm"] > cfg.max_grad_norm
        weights = shard.apply(grads)
        worker.load_weights(weights)
        with torch.no_grad():
            for module, name in MODULES.items():
                layer = policy.get_submodule(module)
                moved = np.abs(weights[f"{name}.weight"] - start[f"{name}.weight"]).max()
                assert moved > 1e-5, f"{name} did not move: the comparison would prove nothing"
                np.testing.assert_allclose(layer.weight.numpy(), weights[f"{name}.weight"], atol=2e-6,
                                           err_msg=f"{name}.weight after update {update + 1}")
                np.testing.assert_allclose(layer.bias.numpy(), weights[f"{name}.bias"], atol=2e-6,
                                           err_msg=f"{name}.bias after update {update + 1}")
    assert clipped, "no update reached the grad-norm clip: the clip is not compared"
