"""Ape-X DQN algorithm module: n-step builder, targets, networks, checkpoints, learning."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import common.algorithms as algorithms
from common.algorithms.checkpoint import load_checkpoint, save_checkpoint
from common.algorithms.device import resolve_device
from common.algorithms.dqn import (
    ALGORITHM,
    DQNLearner,
    DQNPolicy,
    apex_epsilon,
    beta_schedule,
    n_step_target,
    scheduled_epsilon,
)
from common.algorithms.nstep import NStepBuilder
from common.config import DQNConfig

CARTPOLE = gym.make("CartPole-v1")
OBS_SPACE, ACT_SPACE = CARTPOLE.observation_space, CARTPOLE.action_space


# -- n-step builder against a brute-force reference ---------------------------


class Coin(gym.Env[np.ndarray, np.int64]):
    """Tiny env whose observation (episode uid, t) names each state uniquely.

    Random rewards and random terminations; a TimeLimit adds truncations.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, slot: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.uid = slot * 100_000
        self.t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        self.uid += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        reward = float(self.rng.normal() + action)
        return self._obs(), reward, bool(self.rng.random() < 0.15), False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.uid, self.t], np.float32)


class Recorder(gym.Wrapper):
    """Logs every real step of one sub-env, beneath the vector env's autoreset."""

    def __init__(self, env: gym.Env, log: list) -> None:
        super().__init__(env)
        self.log = log
        self.obs: np.ndarray | None = None

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        self.obs, info = self.env.reset(**kwargs)
        self.log.append([])  # a new episode
        return self.obs, info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        next_obs, reward, terminated, truncated, info = self.env.step(action)
        self.log[-1].append((self.obs, int(action), reward, next_obs, terminated, truncated))
        self.obs = next_obs
        return next_obs, reward, terminated, truncated, info


def reference_transitions(episodes: list[list[tuple]], n: int, gamma: float) -> list[tuple]:
    """Every n-step transition of recorded episodes, by the definition."""
    out = []
    for steps in episodes:
        ended = bool(steps) and (steps[-1][4] or steps[-1][5])
        for t in range(len(steps)):
            window = steps[t : t + n]
            if len(window) < n and not ended:
                continue  # still open at the end of the run: not emitted yet
            reward = sum(gamma**k * step[2] for k, step in enumerate(window))
            terminated = any(step[4] for step in window)
            discount = 0.0 if terminated else gamma ** len(window)
            out.append((*steps[t][0], steps[t][1], reward, *window[-1][3], discount))
    return sorted(out)


def as_rows(columns: dict[str, np.ndarray]) -> list[tuple]:
    return [
        (*o, a, r, *no, d)
        for o, a, r, no, d in zip(
            columns["obs"].tolist(),
            columns["action"].tolist(),
            columns["reward"].tolist(),
            columns["next_obs"].tolist(),
            columns["discount"].tolist(),
            strict=True,
        )
    ]


@pytest.mark.parametrize(
    "n_step, mode",
    [
        (3, AutoresetMode.NEXT_STEP),
        (1, AutoresetMode.NEXT_STEP),
        (5, AutoresetMode.NEXT_STEP),
        (3, AutoresetMode.SAME_STEP),
    ],
)
def test_nstep_builder_matches_brute_force(n_step: int, mode: AutoresetMode) -> None:
    gamma, num_envs = 0.9, 4
    logs: list[list] = [[] for _ in range(num_envs)]

    def factory(slot: int) -> Any:
        return lambda: Recorder(gym.wrappers.TimeLimit(Coin(slot, seed=slot), max_episode_steps=6), logs[slot])

    envs = SyncVectorEnv([factory(i) for i in range(num_envs)], autoreset_mode=mode)
    builder = NStepBuilder.for_env(envs, n_step, gamma)
    assert builder.autoreset_mode is mode
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=0)
    builder.reset(obs)
    got = []
    for _ in range(400):
        actions = rng.integers(3, size=num_envs)
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        got += as_rows(builder.add(actions, obs, rewards, terminated, truncated, infos))
    envs.close()

    episodes = [episode for log in logs for episode in log]
    ends = [ep[-1] for ep in episodes if ep and (ep[-1][4] or ep[-1][5])]
    assert any(e[4] for e in ends) and any(e[5] and not e[4] for e in ends), "need both kinds of ending"
    expected = reference_transitions(episodes, n_step, gamma)
    got.sort()
    assert len(got) == len(expected)  # an autoreset step taken as a transition would add rows
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-5, atol=1e-5)
    # Unfinished episodes keep their last min(L, n - 1) steps open.
    unfinished = [log[-1] for log in logs if not (log[-1] and (log[-1][-1][4] or log[-1][-1][5]))]
    assert builder.pending == sum(min(len(steps), n_step - 1) for steps in unfinished)


def test_nstep_builder_drops_the_autoreset_step() -> None:
    """Hand-written NEXT_STEP sequence: the step after an ending is no transition."""
    builder = NStepBuilder(num_envs=1, n_step=2, gamma=0.5, obs_shape=(1,))
    builder.reset(np.array([[0.0]], np.float32))

    def add(action: int, next_obs: float, reward: float, term: bool = False, trunc: bool = False) -> list:
        cols = builder.add(
            np.array([action]),
            np.array([[next_obs]], np.float32),
            np.array([reward]),
            np.array([term]),
            np.array([trunc]),
        )
        return as_rows(cols)

    assert add(1, 1.0, 1.0) == []
    assert add(0, 2.0, 2.0, term=True) == [(0.0, 1, 2.0, 2.0, 0.0), (1.0, 0, 2.0, 2.0, 0.0)]
    assert add(1, 10.0, 0.0) == []  # the reset step: action ignored by the env, not a transition
    assert add(1, 11.0, 4.0) == []
    assert add(0, 12.0, 8.0, trunc=True) == [(10.0, 1, 8.0, 12.0, 0.25), (11.0, 0, 8.0, 12.0, 0.5)]
    assert add(0, 20.0, 0.0) == []
    assert add(1, 21.0, 1.0) == []
    assert add(0, 22.0, 2.0) == [(20.0, 1, 2.0, 22.0, 0.25)]
    with pytest.raises(ValueError, match="not supported"):
        NStepBuilder(1, 2, 0.5, (1,), AutoresetMode.DISABLED)


# -- targets, heads, schedules ----------------------------------------------


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
    metrics, priorities = learner.update(HAND_BATCH, np.array([0.5, 1.0], np.float32))
    # Q(s, a): 2 and 0; targets 5.9 and 1 (terminal); Huber: 3.9 -> 3.4, 1 -> 0.5
    assert priorities.dtype == np.float64
    np.testing.assert_allclose(priorities, [3.901, 1.001], rtol=1e-6)
    assert metrics["loss"] == pytest.approx((0.5 * 3.4 + 0.5) / 2)
    assert metrics["q_mean"] == pytest.approx(1.0)
    assert metrics["td_abs_mean"] == pytest.approx(2.45)

    plain = linear_learner(double=False)
    _, priorities = plain.update(HAND_BATCH)
    np.testing.assert_allclose(priorities, [5.25 + 1e-3, 1.001], rtol=1e-6)


def test_actor_priorities_bootstrap_from_online_max() -> None:
    learner = linear_learner()
    policy = DQNPolicy(learner.cfg, gym.spaces.Box(-10, 10, (2,), np.float32), gym.spaces.Discrete(2))
    policy.load_weights(learner.weights())
    # online only: 0.5 + 0.9 * max(3, 2.5) - 2 = 1.2
    np.testing.assert_allclose(policy.initial_priorities(HAND_BATCH), [1.201, 1.001], rtol=1e-6)


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


def autograd_update(learner: DQNLearner, batch: dict[str, np.ndarray], weights: np.ndarray | None) -> None:
    """The Ape-X update written with autograd and clip_grad_norm_: what DQNLearner.update must equal."""
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
    learner.optimizer.zero_grad(set_to_none=True)
    losses.mean().backward()
    torch.nn.utils.clip_grad_norm_(learner.online.parameters(),
                                   cfg.grad_clip if cfg.grad_clip is not None else float("inf"))
    learner.optimizer.step()
    learner.num_updates += 1
    learner._follow_target()


@pytest.mark.parametrize("hidden,dueling,grad_clip,weighted", [
    ([32, 16], True, 0.05, True), ([32, 16], False, None, False), ([], True, 10.0, True), ([8], False, 0.05, True),
])
def test_update_gradients_match_autograd(hidden: list[int], dueling: bool, grad_clip: float | None,
                                         weighted: bool) -> None:
    """The hand-written backprop of DQNLearner.update takes the same steps as autograd would."""
    cfg = DQNConfig(hidden=hidden, dueling=dueling, grad_clip=grad_clip, huber_delta=0.5, lr=1e-2)
    ours = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=4)
    ref = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=4)
    rng = np.random.default_rng(1)
    for _ in range(6):
        batch = random_batch(rng, size=64)
        batch["reward"] *= 5  # TD errors on both sides of the Huber delta
        weights = rng.random(64).astype(np.float32) if weighted else None
        ours.update(batch, weights)
        autograd_update(ref, batch, weights)
        for (name, a), b in zip(ours.online.named_parameters(), ref.online.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7, msg=lambda m, n=name: f"grad {n}: {m}")
    for a, b in zip(ours.target.parameters(), ref.target.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_apex_epsilon_and_beta() -> None:
    assert apex_epsilon(0, 1, 0.4, 7.0) == 0.4
    assert apex_epsilon(0, 8, 0.4, 7.0) == pytest.approx(0.4)
    assert apex_epsilon(7, 8, 0.4, 7.0) == pytest.approx(0.4**8)
    assert apex_epsilon(2, 5, 0.4, 7.0) == pytest.approx(0.4**4.5)
    with pytest.raises(ValueError):
        apex_epsilon(3, 3, 0.4, 7.0)
    assert ALGORITHM.exploration(DQNConfig(epsilon=0.5, epsilon_alpha=3.0), 1, 2) == pytest.approx(0.5**4)
    assert beta_schedule(0, 0.4, 100) == pytest.approx(0.4)
    assert beta_schedule(50, 0.4, 100) == pytest.approx(0.7)
    assert beta_schedule(500, 0.4, 100) == 1.0
    learner = DQNLearner(DQNConfig(beta_start=0.5, beta_updates=10), OBS_SPACE, ACT_SPACE, device="cpu")
    assert learner.beta() == 0.5 and learner.beta(5) == pytest.approx(0.75)


def test_epsilon_schedule_over_fleet_steps() -> None:
    assert scheduled_epsilon(0.05, 0, 1.0, None) == 0.05  # no schedule: the Ape-X value from the start
    assert scheduled_epsilon(0.05, 0, 1.0, 1000) == 1.0
    assert scheduled_epsilon(0.05, 500, 1.0, 1000) == pytest.approx(0.525)
    assert scheduled_epsilon(0.05, 1000, 1.0, 1000) == 0.05
    assert scheduled_epsilon(0.05, 10**9, 1.0, 1000) == 0.05
    cfg = DQNConfig(epsilon=0.4, epsilon_alpha=7.0, epsilon_decay_steps=10_000, epsilon_start=0.9)
    for index in range(4):  # every actor starts at epsilon_start and ends at its own Ape-X value
        final = apex_epsilon(index, 4, 0.4, 7.0)
        assert ALGORITHM.exploration(cfg, index, 4, 0) == pytest.approx(0.9)
        assert ALGORITHM.exploration(cfg, index, 4, 5_000) == pytest.approx((0.9 + final) / 2)
        assert ALGORITHM.exploration(cfg, index, 4, 20_000) == pytest.approx(final)


def test_epsilon_greedy_acting() -> None:
    policy = DQNPolicy(DQNConfig(hidden=[8]), OBS_SPACE, ACT_SPACE)
    obs = np.random.default_rng(0).normal(size=(2000, 4)).astype(np.float32)
    greedy = policy.q_values(obs).argmax(axis=1)
    actions = policy.act(obs, 0.0, np.random.default_rng(1))
    assert actions.dtype == np.int64 and actions.shape == (2000,)
    np.testing.assert_array_equal(actions, greedy)
    random = policy.act(obs, 1.0, np.random.default_rng(1))
    assert 0.4 < (random == greedy).mean() < 0.6  # uniform over 2 actions


# -- weights, checkpoints, registry ------------------------------------------


def random_batch(rng: np.random.Generator, size: int = 32) -> dict[str, np.ndarray]:
    return {
        "obs": rng.normal(size=(size, 4)).astype(np.float32),
        "action": rng.integers(2, size=size),
        "reward": rng.normal(size=size).astype(np.float32),
        "next_obs": rng.normal(size=(size, 4)).astype(np.float32),
        "discount": (rng.random(size) < 0.9).astype(np.float32) * 0.97,
    }


def test_weights_round_trip_gives_identical_q_values() -> None:
    cfg = DQNConfig(hidden=[32, 32])
    learner = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=1)
    rng = np.random.default_rng(0)
    for _ in range(5):
        learner.update(random_batch(rng))
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


@pytest.mark.parametrize("hidden,dueling", [([32, 16], True), ([16], False), ([], True)])
def test_numpy_q_values_match_torch(hidden: list[int], dueling: bool) -> None:
    """Few rows (acting) go through numpy, many through torch: the same Q-values either way."""
    from common.algorithms.dqn import NUMPY_ROWS

    policy = DQNPolicy(DQNConfig(hidden=hidden, dueling=dueling), OBS_SPACE, ACT_SPACE, seed=5)
    obs = np.random.default_rng(2).normal(size=(NUMPY_ROWS + 1, 4)).astype(np.float32) * 3
    by_torch = policy.q_values(obs)  # above NUMPY_ROWS: torch
    by_numpy = np.concatenate([policy.q_values(obs[:NUMPY_ROWS]), policy.q_values(obs[NUMPY_ROWS:])])
    assert by_numpy.dtype == np.float32 and by_numpy.shape == (NUMPY_ROWS + 1, 2)
    np.testing.assert_allclose(by_numpy, by_torch, rtol=1e-5, atol=1e-5)
    assert np.abs(by_torch).max() > 1e-3  # not trivially zero


def test_state_round_trip_through_torch_save(tmp_path: Path) -> None:
    cfg = DQNConfig(hidden=[32], target_period=3)
    rng = np.random.default_rng(0)
    batches = [random_batch(rng) for _ in range(8)]
    first = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=1)
    for batch in batches[:5]:
        first.update(batch)
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
        m1, p1 = first.update(batch)
        m2, p2 = second.update(batch)
        m3, p3 = third.update(batch)
        assert m1 == m2 == m3
        np.testing.assert_array_equal(p1, p2)
        np.testing.assert_array_equal(p1, p3)
    for a, b in zip(first.target.state_dict().values(), second.target.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="not a DQN checkpoint"):
        second.load_state({"algorithm": "sac"})


def test_target_follows_hard_and_polyak() -> None:
    rng = np.random.default_rng(0)
    hard = DQNLearner(DQNConfig(hidden=[8], target_period=3), OBS_SPACE, ACT_SPACE, device="cpu")
    start = hard.target.state_dict()["value.weight"].clone()
    hard.update(random_batch(rng))
    hard.update(random_batch(rng))
    torch.testing.assert_close(hard.target.state_dict()["value.weight"], start)
    hard.update(random_batch(rng))
    torch.testing.assert_close(hard.target.state_dict()["value.weight"], hard.online.state_dict()["value.weight"])

    soft = DQNLearner(DQNConfig(hidden=[8], target_update="polyak", tau=0.25), OBS_SPACE, ACT_SPACE, device="cpu")
    before = soft.target.state_dict()["value.weight"].clone()
    soft.update(random_batch(rng))
    after = soft.online.state_dict()["value.weight"]
    torch.testing.assert_close(soft.target.state_dict()["value.weight"], 0.75 * before + 0.25 * after)


def test_same_seed_same_learner() -> None:
    cfg = DQNConfig(hidden=[16])
    a = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=7)
    b = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=7)
    batch = random_batch(np.random.default_rng(0))
    assert a.update(batch)[0] == b.update(batch)[0]
    policy = DQNPolicy(cfg, OBS_SPACE, ACT_SPACE, seed=7)  # actors start where the learner starts
    np.testing.assert_array_equal(
        policy.q_values(batch["obs"]), DQNPolicy(cfg, OBS_SPACE, ACT_SPACE, seed=7).q_values(batch["obs"])
    )


def test_registry_and_env_checks() -> None:
    assert algorithms.get("dqn") is ALGORITHM
    assert "dqn" in algorithms.available()
    with pytest.raises(algorithms.UnknownAlgorithm, match="unknown algorithm 'nope'; available: dqn"):
        algorithms.get("nope")
    with pytest.raises(algorithms.UnknownAlgorithm):
        algorithms.get("device")  # a helper module, not an algorithm
    with pytest.raises(ValueError, match="already registered"):
        algorithms.register(
            algorithms.AlgorithmModule(
                "dqn", ALGORITHM.check_env, DQNPolicy, DQNLearner, ALGORITHM.make_builder, ALGORITHM.exploration
            )
        )
    cfg = DQNConfig()
    pendulum = gym.make("Pendulum-v1")
    with pytest.raises(
        algorithms.EnvMismatch, match=r"algorithm dqn needs a Discrete action space; env Pendulum-v1 has Box\("
    ):
        algorithms.check_env(cfg, pendulum.observation_space, pendulum.action_space, "Pendulum-v1")
    with pytest.raises(algorithms.EnvMismatch, match="Box observation space"):
        algorithms.check_env(cfg, gym.spaces.Discrete(5), gym.spaces.Discrete(2))
    with pytest.raises(algorithms.EnvMismatch, match="starting at 0"):
        algorithms.check_env(cfg, OBS_SPACE, gym.spaces.Discrete(2, start=1))
    algorithms.check_env(cfg, OBS_SPACE, ACT_SPACE, "CartPole-v1")
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


# -- it learns ----------------------------------------------------------------

# Hyperparameters that solve CartPole in ~5-30k env steps on 2 CPU cores.
CARTPOLE_CFG = dict(hidden=[64, 64], lr=1e-3, batch_size=64, target_period=100, n_step=3, gamma=0.99)


def greedy_return(policy: DQNPolicy, seed: int, episodes: int = 10) -> float:
    envs = gym.make_vec("CartPole-v1", num_envs=episodes)
    obs, _ = envs.reset(seed=seed)
    returns, done = np.zeros(episodes), np.zeros(episodes, bool)
    while not done.all():
        obs, rewards, terminated, truncated, _ = envs.step(policy.act(obs, 0.0, np.random.default_rng(0)))
        returns += rewards * ~done
        done |= terminated | truncated
    envs.close()
    return float(returns.mean())


def test_learns_cartpole() -> None:
    seed, num_envs, budget, capacity = 0, 4, 60_000, 50_000
    cfg = DQNConfig(**CARTPOLE_CFG)
    envs = gym.make_vec("CartPole-v1", num_envs=num_envs)
    learner = DQNLearner(cfg, OBS_SPACE, ACT_SPACE, device="cpu", seed=seed)
    policy = DQNPolicy(cfg, OBS_SPACE, ACT_SPACE, seed=seed)
    builder = ALGORITHM.make_builder(cfg, envs)
    rng = np.random.default_rng(seed)
    replay = {k: np.zeros((capacity, *v.shape[1:]), v.dtype) for k, v in random_batch(rng, 1).items()}
    size = head = 0
    obs, _ = envs.reset(seed=seed)
    builder.reset(obs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small nets: one thread is fastest and deterministic
    best = 0.0
    try:
        for step in range(num_envs, budget + 1, num_envs):
            epsilon = max(0.05, 1.0 - 0.95 * step / 10_000)
            actions = policy.act(obs, epsilon, rng)
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            columns = builder.add(actions, obs, rewards, terminated, truncated, infos)
            rows = (head + np.arange(len(columns["action"]))) % capacity
            for key, value in columns.items():
                replay[key][rows] = value
            head, size = (head + len(rows)) % capacity, min(size + len(rows), capacity)
            if size < 1000:
                continue
            idx = rng.integers(size, size=cfg.batch_size)
            learner.update({key: value[idx] for key, value in replay.items()})
            policy.load_weights(learner.weights())
            if step % 2000 == 0:
                best = max(best, greedy_return(policy, seed=10_000 + step))
                if best >= 195:
                    break
    finally:
        torch.set_num_threads(threads)
        envs.close()
    assert best >= 195, f"greedy mean return {best} after {step} env steps"
    # Balancing alone can be learnt from short-sighted values (CartPole forgives
    # a lot); bootstrapping shows in Q: without it Q(s0) <= 1 + g + g^2 < 3.
    starts = gym.make_vec("CartPole-v1", num_envs=8)
    start, _ = starts.reset(seed=seed)
    starts.close()
    q_start = float(policy.q_values(start).max(axis=1).mean())
    assert q_start > 10, f"Q(s0) = {q_start}: values do not propagate past the n-step horizon"


def test_evaluation_same_on_sync_async_and_reused_envs() -> None:
    from common import config as config_mod
    from services.actor.evaluator import eval_envs, evaluate

    cfg = config_mod.load(data={"env": {"max_episode_steps": 60}, "algorithm": {"name": "dqn", "hidden": [16]}},
                          environ={})
    policy = DQNPolicy(cfg.algorithm, OBS_SPACE, ACT_SPACE, seed=1)
    fresh = evaluate(policy, cfg, 3, 0.2, seed=7)
    assert fresh.shape == (3,) and (fresh > 0).all()
    for mode in ("async", "threads"):
        on = cfg.model_copy(update={"evaluator": cfg.evaluator.model_copy(update={"vectorization": mode})})
        envs = eval_envs(on, 3, seed=7)
        try:
            for _ in range(2):  # kept open across evaluations: every slot is reset with its seed each time
                np.testing.assert_array_equal(evaluate(policy, on, 3, 0.2, seed=7, envs=envs), fresh)
        finally:
            envs.close()
