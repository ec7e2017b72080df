"""Checkpoints that move between CPU and CUDA (issue 39, item 4), for every algorithm with a learner.

Every learner's checkpoint is plain CPU tensors (loaded with ``map_location="cpu"``; networks and
optimizer moments are copied onto the learner's own device when loaded). What did not move was a
torch generator's state (SAC's sampling, TD3's smoothing noise): a CUDA generator's is 16 bytes
(Philox seed and offset), a CPU one's 5056 (Mersenne Twister), and loading either into the other
raised. Here the CUDA side is simulated on CPU: a checkpoint whose generator state has the CUDA
size and tag (or the size alone, as checkpoints before the tag) loads on CPU, re-seeding the
generator deterministically from it; the decision for a CUDA learner handed a CPU state is
checked as a function (no CUDA here). A3C has no learner: its state is the paramserver's shard
optimizers, on CPU.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.common.algorithms import registry
from rlfleet.common.algorithms.checkpoint import load_checkpoint, save_checkpoint
from rlfleet.common.algorithms.generators import plan, reseed_from, restore_generator

DISCRETE = (gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2))
CONTINUOUS = (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
SPACES = {"dqn": DISCRETE, "ppo": DISCRETE, "sac": CONTINUOUS, "td3": CONTINUOUS}
WITH_GENERATOR = ("sac", "td3")
CPU_STATE_BYTES = torch.Generator().get_state().numel()  # 5056
CUDA_STATE_BYTES = 16  # Philox: seed and offset, two uint64


def cuda_generator_state(seed: int, offset: int) -> torch.Tensor:
    """What ``torch.Generator("cuda").get_state()`` returns: seed and offset, little-endian uint64."""
    return torch.frombuffer(bytearray(seed.to_bytes(8, "little") + offset.to_bytes(8, "little")), dtype=torch.uint8)


def learner(name: str, seed: int = 0) -> Any:
    builder = registry.get(name)
    obs, act = SPACES[name]
    return builder.make_learner(builder.config(), obs, act, device="cpu", seed=seed)


def assert_same_state(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_state(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_state(x, y)
    else:
        assert a == b


def test_every_algorithm_with_a_learner_is_covered() -> None:
    with_learner = {name for name in registry.builtin_names() if registry.get(name).learner is not None}
    assert with_learner == set(SPACES), "a new algorithm's learner: add its spaces here"
    assert registry.get("a3c").learner is None


@pytest.mark.parametrize("name", sorted(SPACES))
def test_a_checkpoint_loads_into_a_learner_of_another_seed_exactly(name: str, tmp_path: Path) -> None:
    a = learner(name)
    for optimizer in a.optimizers.values():
        optimizer.ensure_state()  # moments in the file, as after training
    a.num_updates = 3
    save_checkpoint(tmp_path / "checkpoint.pt", {"core": a.state()})
    loaded = load_checkpoint(tmp_path / "checkpoint.pt")
    assert loaded is not None
    b = learner(name, seed=11)
    b.load_state(loaded["core"])
    assert_same_state(a.state(), b.state())
    if name in WITH_GENERATOR:
        assert loaded["core"]["generator_device"] == "cpu"  # what the other device needs to tell


@pytest.mark.parametrize("name", WITH_GENERATOR)
@pytest.mark.parametrize("tagged", [True, False], ids=["tagged", "untagged"])
def test_a_cuda_generator_state_loads_on_cpu_reseeded_deterministically(name: str, tagged: bool, tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The issue's crash ("Expected a CPUGeneratorImplState of size 5056 but found 16") is gone: a
    checkpoint written by a CUDA learner (tagged, or from before the tag) resumes on CPU."""
    state = learner(name).state()
    state["generator"] = cuda_generator_state(seed=1, offset=4096)
    if tagged:
        state["generator_device"] = "cuda"
    else:
        state.pop("generator_device")
    save_checkpoint(tmp_path / "checkpoint.pt", {"core": state})
    draws = []
    for seed in (3, 4):  # two resumes of the same checkpoint draw the same stream
        loaded = load_checkpoint(tmp_path / "checkpoint.pt")
        assert loaded is not None
        b = learner(name, seed=seed)
        with caplog.at_level(logging.WARNING, logger="rlfleet.learner"):
            b.load_state(loaded["core"])
        assert b.gen.initial_seed() == reseed_from(cuda_generator_state(1, 4096))
        draws.append(torch.randn(8, generator=b.gen))
    torch.testing.assert_close(draws[0], draws[1], rtol=0, atol=0)
    assert not torch.equal(draws[0], torch.randn(8, generator=torch.Generator().manual_seed(1)))
    said = caplog.text
    assert f"{'cuda' if tagged else 'untagged'} generator state ({CUDA_STATE_BYTES} bytes)" in said
    assert f"this cpu generator ({CPU_STATE_BYTES} bytes): re-seeded from it deterministically" in said


def test_the_generator_plan_for_each_direction() -> None:
    assert plan(CPU_STATE_BYTES, "cpu", "cpu", CPU_STATE_BYTES) == "restore"
    assert plan(CPU_STATE_BYTES, None, "cpu", CPU_STATE_BYTES) == "restore"  # before the tag: same size
    assert plan(CUDA_STATE_BYTES, "cuda", "cuda", CUDA_STATE_BYTES) == "restore"
    assert plan(CUDA_STATE_BYTES, "cuda", "cpu", CPU_STATE_BYTES) == "reseed"
    assert plan(CPU_STATE_BYTES, "cpu", "cuda", CUDA_STATE_BYTES) == "reseed"  # a CPU checkpoint on a GPU
    assert plan(CPU_STATE_BYTES, None, "cuda", CUDA_STATE_BYTES) == "reseed"
    assert plan(CUDA_STATE_BYTES, "cpu", "cpu", CPU_STATE_BYTES) == "reseed"  # tag and size disagree: never set_state


def test_a_state_that_is_no_generator_state_is_refused_by_name() -> None:
    gen = torch.Generator()
    with pytest.raises(ValueError, match=r"checkpoint's 'generator' is not a generator state \(a 1-d uint8 tensor\)"):
        restore_generator(gen, {"generator": torch.zeros(16)})
    with pytest.raises(ValueError, match=r"generator_device='tpu'; allowed: 'cpu', 'cuda'"):
        restore_generator(gen, {"generator": gen.get_state(), "generator_device": "tpu"})
    before = gen.get_state()
    assert restore_generator(gen, {"generator": before, "generator_device": "cpu"}) == "restore"
    assert torch.equal(gen.get_state(), before)
