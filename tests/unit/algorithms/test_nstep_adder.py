"""The n-step adder against a brute-force reference, across autoreset modes; the version column."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlfleet.common.algorithms.adders.nstep import NStepAdder


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
def test_nstep_adder_matches_brute_force(n_step: int, mode: AutoresetMode) -> None:
    gamma, num_envs = 0.9, 4
    logs: list[list] = [[] for _ in range(num_envs)]

    def factory(slot: int) -> Any:
        return lambda: Recorder(gym.wrappers.TimeLimit(Coin(slot, seed=slot), max_episode_steps=6), logs[slot])

    envs = SyncVectorEnv([factory(i) for i in range(num_envs)], autoreset_mode=mode)
    adder = NStepAdder.for_env(envs, n_step, gamma)
    assert adder.autoreset_mode is mode
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=0)
    adder.reset(obs)
    got = []
    for _ in range(400):
        actions = rng.integers(3, size=num_envs)
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        items = adder.add(actions, {}, obs, rewards, terminated, truncated, infos, 7)
        assert items["version"].dtype == np.int64 and (items["version"] == 7).all()
        got += as_rows(items)
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
    assert adder.pending == sum(min(len(steps), n_step - 1) for steps in unfinished)


def test_nstep_adder_drops_the_autoreset_step() -> None:
    """Hand-written NEXT_STEP sequence: the step after an ending is no transition."""
    adder = NStepAdder(num_envs=1, n_step=2, gamma=0.5, obs_shape=(1,))
    adder.reset(np.array([[0.0]], np.float32))

    versions: list[list[int]] = []

    def add(action: int, next_obs: float, reward: float, term: bool = False, trunc: bool = False) -> list:
        cols = adder.add(
            np.array([action]),
            {},
            np.array([[next_obs]], np.float32),
            np.array([reward]),
            np.array([term]),
            np.array([trunc]),
            None,
            len(versions),  # a new weights version every step
        )
        versions.append(cols["version"].tolist())
        return as_rows(cols)

    assert add(1, 1.0, 1.0) == []
    assert add(0, 2.0, 2.0, term=True) == [(0.0, 1, 2.0, 2.0, 0.0), (1.0, 0, 2.0, 2.0, 0.0)]
    assert add(1, 10.0, 0.0) == []  # the reset step: action ignored by the env, not a transition
    assert add(1, 11.0, 4.0) == []
    assert add(0, 12.0, 8.0, trunc=True) == [(10.0, 1, 8.0, 12.0, 0.25), (11.0, 0, 8.0, 12.0, 0.5)]
    assert add(0, 20.0, 0.0) == []
    assert add(1, 21.0, 1.0) == []
    assert add(0, 22.0, 2.0) == [(20.0, 1, 2.0, 22.0, 0.25)]
    # each transition carries the version its first action was taken with (the oldest of its window)
    assert versions == [[], [0, 1], [], [], [3, 4], [], [], [6]]
    with pytest.raises(ValueError, match="not supported"):
        NStepAdder(1, 2, 0.5, (1,), AutoresetMode.DISABLED)
