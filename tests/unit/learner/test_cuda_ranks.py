"""CUDA learner ranks, decided on CPU (issue 39, item 2): which backend a group forms with, which GPU
each rank trains on, and what a rank sets so NCCL's errors reach the clean fatal error.

A group of CUDA learners must carry CPU tensors too (``broadcast_learner``'s update counter and
CPU-copied state, PPO's group sums): its backend is ``cpu:gloo,cuda:nccl``; CPU learners keep plain
gloo. Real gloo groups of real processes are in tests/unit/algorithms/test_data_parallel.py and
tests/unit/learner/test_network_interface.py; a torch without NCCL cannot form the CUDA group.
"""

from __future__ import annotations

import pytest
import torch

from harness.service_procs import CARTPOLE
from rlfleet.common import config as config_mod
from rlfleet.common.runtime import StartupError
from rlfleet.services.learner.ranks import CUDA_BACKEND, backend, local_device, nccl_environment

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _cfg(wanted: str) -> config_mod.Experiment:
    return config_mod.load(CARTPOLE, environ={}, sets=["learners=2", f"learner.backend={wanted}"])


def test_cpu_learners_keep_plain_gloo() -> None:
    assert backend(_cfg("auto"), CPU) == "gloo"
    assert backend(_cfg("gloo"), CPU) == "gloo"
    with pytest.raises(StartupError, match="learner.backend=nccl needs CUDA.*allowed here: gloo or auto"):
        backend(_cfg("nccl"), CPU)


def test_cuda_learners_get_a_group_with_a_cpu_backend_beside_nccl() -> None:
    assert CUDA_BACKEND == "cpu:gloo,cuda:nccl"
    assert backend(_cfg("auto"), CUDA) == CUDA_BACKEND
    assert backend(_cfg("nccl"), torch.device("cuda:1")) == CUDA_BACKEND
    assert backend(_cfg("gloo"), CUDA) == "gloo"  # asked for: gloo carries CUDA tensors too, slower
    # torch parses it as one backend per device type: CPU tensors have gloo
    parsed = torch.distributed.Backend(CUDA_BACKEND)
    assert "cpu:gloo" in parsed and "cuda:nccl" in parsed


def test_each_rank_trains_on_its_own_gpu() -> None:
    assert [local_device(CUDA, rank, {}, 2) for rank in range(4)] == [torch.device("cuda", i) for i in (0, 1, 0, 1)]
    assert local_device(CUDA, 3, {"LOCAL_RANK": "0"}, 2) == torch.device("cuda", 0)  # the launcher's word first
    assert local_device(torch.device("cuda:1"), 0, {"LOCAL_RANK": "0"}, 2) == torch.device("cuda", 1)  # as named
    assert local_device(CPU, 5, {"LOCAL_RANK": "1"}, 0) == CPU  # CPU ranks: unchanged


@pytest.mark.parametrize("local_rank", ["2", "-1", "first"])
def test_a_local_rank_naming_no_visible_gpu_is_refused(local_rank: str) -> None:
    with pytest.raises(StartupError, match=rf"LOCAL_RANK='{local_rank}' names no visible CUDA device; "
                                           r"allowed: 0\.\.1 \(2 visible\)"):
        local_device(CUDA, 0, {"LOCAL_RANK": local_rank}, 2)
    with pytest.raises(StartupError, match=r"no CUDA device is visible \(CUDA_VISIBLE_DEVICES=''\)"):
        local_device(CUDA, 0, {"CUDA_VISIBLE_DEVICES": ""}, 0)


def test_nccl_collectives_wait_and_raise_unless_the_environment_says_otherwise() -> None:
    environ: dict[str, str] = {}
    assert nccl_environment(environ) == {"TORCH_NCCL_BLOCKING_WAIT": "1"}
    assert environ == {"TORCH_NCCL_BLOCKING_WAIT": "1"}
    kept = {"TORCH_NCCL_BLOCKING_WAIT": "0"}
    assert nccl_environment(kept) == {} and kept == {"TORCH_NCCL_BLOCKING_WAIT": "0"}
