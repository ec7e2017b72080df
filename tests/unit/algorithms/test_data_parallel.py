"""Data-parallel learners: N ranks of a real gloo process group, each learning from B/N items of
every batch with its gradients averaged over the group, end with the parameters one process
reaches learning from all B (float tolerance), for DQN and PPO. SAC's actor loss draws its own
noise per item, so ranks drawing for their halves take another (equally distributed) step than
one process drawing for all B: for SAC the ranks end identical to each other."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from harness.data_parallel_ranks import ITEMS, SEGMENT_LENGTH, SEGMENTS, STEPS
from harness.replay_helpers import PYTHON, ROOT
from rlfleet.common.wire.transport import free_tcp_port

RANKS = ROOT / "harness" / "data_parallel_ranks.py"


def transitions(rng: np.random.Generator, obs_dim: int, continuous: bool) -> dict[str, np.ndarray]:
    return {
        "obs": rng.normal(size=(ITEMS, obs_dim)).astype(np.float32),
        "action": (rng.uniform(-2, 2, (ITEMS, 1)).astype(np.float32) if continuous
                   else rng.integers(2, size=ITEMS)),
        "reward": rng.normal(size=ITEMS).astype(np.float32),
        "next_obs": rng.normal(size=(ITEMS, obs_dim)).astype(np.float32),
        "discount": (rng.random(ITEMS) < 0.9).astype(np.float32) * 0.99,
        "version": np.zeros(ITEMS, np.int64),
    }


def segments(seed: int) -> dict[str, np.ndarray]:
    """Real CartPole segments from PPO's own acting path."""
    from harness.data_parallel_ranks import learner
    from rlfleet.common.algorithms.ppo import BUILDER

    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * SEGMENTS,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    space = envs.single_observation_space, envs.single_action_space
    cfg = learner("ppo", 1).cfg
    policy = BUILDER.make_policy(cfg, *space, seed=0, act_seed=[seed, 1])
    adder = BUILDER.make_adder(cfg, SEGMENTS, *space, "SameStep")
    obs, _ = envs.reset(seed=seed)
    adder.reset(obs)
    for _ in range(SEGMENT_LENGTH):
        actions, extras = policy.act(obs)
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        items = adder.add(actions, extras, obs, rewards, terminated, truncated, infos, 0)
    envs.close()
    assert len(items["version"]) == SEGMENTS
    return items


def data(algo: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    out = {}
    for step in range(STEPS):
        batch = (segments(step) if algo == "ppo"
                 else transitions(rng, 3 if algo == "sac" else 4, continuous=algo == "sac"))
        out.update({f"{step}/{key}": value for key, value in batch.items()})
    return out


def run(algo: str, world: int, data_path: Path, tmp_path: Path, *extra: str) -> list[dict[str, np.ndarray]]:
    port = free_tcp_port()
    outs = [tmp_path / f"{algo}-{world}-{rank}.npz" for rank in range(world)]
    procs = [subprocess.Popen([PYTHON, str(RANKS), algo, str(rank), str(world), str(port), str(data_path),
                               str(outs[rank]), *extra], env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for rank in range(world)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()
    result = []
    for path in outs:
        with np.load(path) as npz:
            result.append(dict(npz))
    return result


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_two_ranks_with_half_batches_end_where_one_rank_with_the_whole_batch_does(algo: str,
                                                                                  tmp_path: Path) -> None:
    data_path = tmp_path / f"{algo}.npz"
    np.savez(data_path, **data(algo))
    (single,) = run(algo, 1, data_path, tmp_path)
    ranks = run(algo, 2, data_path, tmp_path)
    for name, reference in single.items():
        for rank in ranks:  # every rank holds the same weights, and they are the one-process ones
            np.testing.assert_allclose(rank[name], reference, rtol=1e-4, atol=1e-5, err_msg=f"{algo} {name}")
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name])
    # the steps really moved the weights (an all-reduce of zeros would pass the above too)
    from harness.data_parallel_ranks import learner

    initial = learner(algo, 1).weights()
    assert any(not np.allclose(initial[name], single[name]) for name in single)


def test_sac_ranks_stay_identical(tmp_path: Path) -> None:
    data_path = tmp_path / "sac.npz"
    np.savez(data_path, **data("sac"))
    ranks = run("sac", 2, data_path, tmp_path)
    from harness.data_parallel_ranks import learner

    initial = learner("sac", 1).weights()
    for name, value in ranks[0].items():
        np.testing.assert_array_equal(ranks[1][name], value)
    assert any(not np.allclose(initial[name], ranks[0][name]) for name in initial)


@pytest.mark.parametrize("algo", ["dqn", "ppo", "sac"])
def test_ranks_start_from_the_rank_that_trained_furthest(algo: str, tmp_path: Path) -> None:
    """A rank that resumed further (here: two updates ahead, optimizer moments, counters, PPO's
    statistics and generator) gives its whole state to a fresh one; they go on identical."""
    data_path = tmp_path / f"{algo}.npz"
    np.savez(data_path, **data(algo))
    ranks = run(algo, 2, data_path, tmp_path, "ahead")
    for name, value in ranks[0].items():
        np.testing.assert_array_equal(ranks[1][name], value, err_msg=f"{algo} {name}")
