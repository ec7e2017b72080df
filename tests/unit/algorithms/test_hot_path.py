"""The learners' hot path as a GPU runs it, checked on CPU: reusable staging buffers, one copy back for
figures and priorities, PPO's GAE in torch, checkpoints written off the training thread; and on CPU, no
staging and no copy of the batch at all."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.common.algorithms.checkpoint import CheckpointWriter, load_checkpoint
from rlfleet.common.algorithms.device import HostStaging, to_host
from rlfleet.common.algorithms.dqn.config import DQNConfig
from rlfleet.common.algorithms.dqn.learner import DQNLearner
from rlfleet.common.algorithms.ppo.config import PPOConfig
from rlfleet.common.algorithms.ppo.learner import PPOLearner
from rlfleet.common.algorithms.ppo.losses import gae, gae_torch
from rlfleet.common.algorithms.sac.config import SACConfig
from rlfleet.common.algorithms.sac.learner import SACLearner
from rlfleet.common.algorithms.td3.config import TD3Config
from rlfleet.common.algorithms.td3.learner import TD3Learner

CPU = torch.device("cpu")
OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


def read_only(array: np.ndarray) -> np.ndarray:
    """As the wire decodes a column: a read-only view of the message's frame."""
    array = np.ascontiguousarray(array)
    array.flags.writeable = False
    return array


# -- staging ------------------------------------------------------------------------------------------
def test_a_column_reuses_its_buffer_and_grows_it_only_for_a_larger_batch() -> None:
    staging = HostStaging(CPU, staged=True, pin=False)
    rng = np.random.default_rng(0)
    first = rng.normal(size=(4, 3)).astype(np.float32)
    host = staging.stage("obs", first)
    assert host.dtype == torch.float32 and host.shape == (4, 3) and staging.allocations == 1
    np.testing.assert_array_equal(host.numpy(), first)
    assert host.data_ptr() != first.ctypes.data  # a copy into the buffer, not the array itself
    ptr = staging.buffers["obs"].data_ptr()

    again = rng.normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_array_equal(staging.stage("obs", again).numpy(), again)
    smaller = rng.normal(size=(2, 3)).astype(np.float32)
    np.testing.assert_array_equal(staging.stage("obs", smaller).numpy(), smaller)
    assert staging.allocations == 1 and staging.buffers["obs"].data_ptr() == ptr

    larger = rng.normal(size=(9, 3)).astype(np.float32)
    grown = staging.stage("obs", larger)
    np.testing.assert_array_equal(grown.numpy(), larger)
    assert staging.allocations == 2 and staging.buffers["obs"].numel() == larger.nbytes

    # another dtype and shape in the same bytes; each column its own buffer
    ints = np.arange(5, dtype=np.int64)
    assert staging.stage("obs", ints).tolist() == ints.tolist() and staging.allocations == 2
    done = rng.random((3, 2)) < 0.5
    flags = staging.stage("terminated", done)
    assert flags.dtype == torch.bool and flags.numpy().tolist() == done.tolist() and staging.allocations == 3
    assert staging.stage("obs", np.zeros((0, 3), np.float32)).shape == (0, 3)


def test_staging_takes_read_only_and_strided_columns() -> None:
    staging = HostStaging(CPU, staged=True, pin=False)
    frame = read_only(np.arange(24, dtype=np.float32).reshape(4, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = staging.to_device({"obs": frame, "strided": frame[:, ::2], "scalar": np.array(2.5)})
    np.testing.assert_array_equal(out["obs"].numpy(), frame)
    np.testing.assert_array_equal(out["strided"].numpy(), frame[:, ::2])
    assert out["scalar"].item() == 2.5 and out["scalar"].dtype == torch.float64
    assert set(staging.buffers) == {"obs", "strided", "scalar"}


def test_on_cpu_nothing_is_staged_and_the_batch_is_not_copied() -> None:
    staging = HostStaging(CPU)
    assert not staging.staged and not staging.pin
    batch = {"obs": read_only(np.ones((5, 3), np.float32)), "action": np.arange(5)}
    out = staging.to_device(batch)
    for key, array in batch.items():
        assert out[key].data_ptr() == array.ctypes.data  # the array's own memory
    assert staging.buffers == {} and staging.allocations == 0


def test_a_cuda_learner_would_stage_and_pin() -> None:
    staging = HostStaging(torch.device("cuda"))  # only its settings: nothing touches CUDA here
    assert staging.staged and staging.pin


# -- figures and priorities -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_copy_back_gives_the_separate_copies_values(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    figures = torch.randn(5, generator=gen).to(dtype)
    priorities = torch.rand(64, generator=gen) + 1e-6
    packed = to_host(figures, priorities, packed=True)
    assert packed[0] == figures.cpu().tolist()  # what the learners did before: one .cpu() each
    np.testing.assert_array_equal(packed[1], priorities.double().cpu().numpy())
    assert packed[1].dtype == np.float64 and packed[1].shape == (64,)
    separate = to_host(figures, priorities)  # on CPU: not packed
    assert separate[0] == packed[0] and np.array_equal(separate[1], packed[1])


def replay_batch(algo: str, rng: np.random.Generator, n: int = 32) -> dict[str, np.ndarray]:
    action = rng.integers(2, size=n) if algo == "dqn" else rng.uniform(-1, 1, (n, 2)).astype(np.float32)
    return {key: read_only(value) for key, value in {
        "obs": rng.normal(size=(n, 3)).astype(np.float32), "action": action,
        "reward": rng.normal(size=n).astype(np.float32), "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
        "discount": np.full(n, 0.97, np.float32)}.items()}


def make(algo: str) -> Any:
    if algo == "dqn":
        return DQNLearner(DQNConfig(hidden=[16], batch_size=32), OBS, gym.spaces.Discrete(2), device="cpu", seed=1)
    box = gym.spaces.Box(-2.0, 1.0, (2,), np.float32)
    if algo == "sac":
        return SACLearner(SACConfig(hidden=[16], critic_hidden=[16], batch_size=32), OBS, box, device="cpu", seed=1)
    return TD3Learner(TD3Config(hidden=[16], critic_hidden=[16], batch_size=32, policy_delay=2), OBS, box,
                      device="cpu", seed=1)


@pytest.mark.parametrize("algo", ["dqn", "sac", "td3"])
def test_the_staged_path_learns_exactly_as_the_cpu_path_and_reuses_its_buffers(algo: str) -> None:
    """The path a CUDA learner takes (batch through reused buffers, figures and priorities in one copy),
    run on CPU, gives the figures, priorities and weights of the CPU path (which copies nothing)."""
    plain, staged = make(algo), make(algo)
    staged.staging = HostStaging(CPU, staged=True, pin=False)
    rng = np.random.default_rng(7)
    for _ in range(3):
        batch = replay_batch(algo, rng)
        weights = rng.uniform(0.2, 1.0, 32)
        figures, priorities = plain.learn(batch, weights)
        staged_figures, staged_priorities = staged.learn(batch, weights)
        assert staged_figures == figures
        np.testing.assert_array_equal(staged_priorities, priorities)
        assert priorities.dtype == np.float64 and priorities.shape == (32,)
    assert staged.staging.allocations == len(staged.staging.buffers) == 6  # five columns and the weights, once
    assert plain.staging.allocations == 0 and plain.staging.buffers == {}
    for a, b in zip(plain.state()["optimizers"].values(), staged.state()["optimizers"].values(), strict=True):
        for x, y in zip(a["state"].values(), b["state"].values(), strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


# -- PPO: GAE on the device -----------------------------------------------------------------------------
def random_segments(rng: np.random.Generator, S: int, T: int) -> dict[str, np.ndarray]:
    return {
        "reward": rng.normal(size=(S, T)), "values": rng.normal(size=(S, T)), "next_values": rng.normal(size=(S, T)),
        "terminated": rng.random((S, T)) < 0.1, "truncated": rng.random((S, T)) < 0.1,
        "rho": rng.uniform(0.0, 1.0, (S, T)),
    }


@pytest.mark.parametrize(("S", "T", "vtrace"), [(6, 40, False), (6, 40, True), (1, 1, False), (3, 1, True)])
def test_torch_gae_equals_numpys(S: int, T: int, vtrace: bool) -> None:
    d = random_segments(np.random.default_rng(S * 100 + T), S, T)
    end = d["terminated"] | d["truncated"]
    rho = d["rho"] if vtrace else None
    want_adv, want_ret = gae(d["reward"], d["values"], d["next_values"], d["terminated"], end, 0.99, 0.95, rho)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        def t(x: np.ndarray, dtype: torch.dtype = dtype) -> torch.Tensor:
            return torch.as_tensor(x, dtype=dtype if x.dtype != bool else torch.bool)

        adv, ret = gae_torch(t(d["reward"]), t(d["values"]), t(d["next_values"]), t(d["terminated"]), t(end),
                             0.99, 0.95, None if rho is None else t(rho))
        assert adv.dtype == dtype and adv.shape == (S, T)
        scale = max(1.0, float(np.abs(want_adv).max()))
        np.testing.assert_allclose(adv.numpy(), want_adv, rtol=tol, atol=tol * scale)
        np.testing.assert_allclose(ret.numpy(), want_ret, rtol=tol, atol=tol * scale)


def ppo_batch(rng: np.random.Generator, S: int, T: int) -> dict[str, np.ndarray]:
    columns: dict[str, np.ndarray] = {
        "obs": rng.normal(size=(S, T, 3)).astype(np.float32), "action": rng.integers(2, size=(S, T)),
        "reward": rng.normal(size=(S, T)).astype(np.float32), "terminated": rng.random((S, T)) < 0.1,
        "truncated": rng.random((S, T)) < 0.1, "final_obs": rng.normal(size=(S, T, 3)).astype(np.float32),
        "bootstrap_obs": rng.normal(size=(S, 3)).astype(np.float32),
        "logp": np.log(rng.uniform(0.2, 0.8, (S, T))).astype(np.float32),
        "value": rng.normal(size=(S, T)).astype(np.float32)}
    return {key: read_only(value) for key, value in columns.items()}


@pytest.mark.parametrize("vtrace", [True, False])
def test_ppo_on_the_device_path_learns_as_on_the_host_path(vtrace: bool) -> None:
    """A GPU learner's PPO (staged batch, GAE in float32 torch, one copy of the figures) run on CPU: the
    rows and figures of numpy's float64 GAE, to float32's rounding."""
    cfg = PPOConfig(hidden=[16], segment_length=8, batch_segments=3, minibatch_size=8, epochs=2, vtrace=vtrace)
    host = PPOLearner(cfg, OBS, gym.spaces.Discrete(2), device="cpu", seed=4)
    device = PPOLearner(cfg, OBS, gym.spaces.Discrete(2), device="cpu", seed=4)
    device.staging = HostStaging(CPU, staged=True, pin=False)
    device.gae_on_device = True
    batch = ppo_batch(np.random.default_rng(11), 3, 8)
    want, got = host.prepare(batch), device.prepare(batch)
    for key in ("obs", "action", "logp", "weight", "old_value"):
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
    for key in ("advantage", "return"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5)
    assert device.behaviour == host.behaviour and host.behaviour["value_drift"] > 0
    want_figures, _ = host.learn(batch)
    got_figures, _ = device.learn(batch)
    assert set(got_figures) == set(want_figures)
    for key, value in want_figures.items():
        assert got_figures[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_ppo_on_cpu_trains_on_the_batchs_own_memory() -> None:
    cfg = PPOConfig(hidden=[16], segment_length=8, batch_segments=2, minibatch_size=8, epochs=1, obs_norm=False)
    learner = PPOLearner(cfg, OBS, gym.spaces.Discrete(2), device="cpu", seed=0)
    assert not learner.gae_on_device
    batch = ppo_batch(np.random.default_rng(2), 2, 8)
    rows = learner.prepare(batch)
    assert rows["obs"].data_ptr() == batch["obs"].ctypes.data
    assert rows["action"].data_ptr() == batch["action"].ctypes.data
    figures, _ = learner.learn(batch)
    assert np.isfinite(list(figures.values())).all()
    assert learner.staging.buffers == {} and learner.staging.allocations == 0


# -- checkpoints off the training thread ------------------------------------------------------------------
def test_checkpoints_are_written_on_a_thread_of_their_own_one_at_a_time(tmp_path: Path) -> None:
    writer = CheckpointWriter()
    path = tmp_path / "learner" / "checkpoint.pt"
    threads: list[str] = []
    try:
        for version in range(3):
            state = {"version": version, "w": torch.full((1000,), float(version))}
            writer.write(path, state, lambda: threads.append(threading.current_thread().name))
        writer.wait()
        saved = load_checkpoint(path)
        assert saved is not None and saved["version"] == 2 and float(saved["w"][0]) == 2.0
        assert len(threads) == 3 and all(name.startswith("checkpoint-writer") for name in threads)
        assert threading.current_thread().name not in threads
        assert [p.name for p in path.parent.iterdir()] == ["checkpoint.pt"]  # no temporary file left

        (tmp_path / "file").write_text("")
        writer.write(tmp_path / "file" / "checkpoint.pt", {"version": 3})  # its folder is a file: fails there...
        with pytest.raises(OSError):
            writer.write(path, {"version": 4})  # ...and the caller hears it at its next call, which writes nothing
        assert load_checkpoint(path)["version"] == 2  # type: ignore[index]
        writer.write(path, {"version": 4})  # and the writer goes on
        writer.wait()
        saved = load_checkpoint(path)
        assert saved is not None and saved["version"] == 4
    finally:
        writer.close()
