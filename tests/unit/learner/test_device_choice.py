"""The learner's device said out loud (issue 39, item 3): ``learner.device``'s decision with its
reason, auto's rule (CUDA only for networks of at least AUTO_CUDA_MIN_PARAMETERS parameters), the
probe on this machine's real torch, the message for a driver too old for the wheel, and a real
LearnerService logging and exporting what it trains on."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NoReturn

import pytest
import torch
from prometheus_client import generate_latest

from harness.fleet_helpers import CONFIGS
from harness.service_threads import replay_and_paramserver
from rlfleet.common.algorithms.device_choice import (
    AUTO_CUDA_MIN_PARAMETERS,
    CudaProbe,
    choose_device,
    driver_too_old_message,
    probe_cuda,
)
from rlfleet.common.config import load
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.learner.learner import LearnerService

GPU = CudaProbe(True, "cuda:0 (NVIDIA H100)")
NONE = CudaProbe(False, "torch 2.13.0+cpu has no CUDA")


def never() -> NoReturn:
    raise AssertionError("asked for what the decision does not need")


def test_auto_picks_cuda_only_for_a_network_big_enough() -> None:
    small = choose_device("auto", lambda: GPU, lambda: 4_610)  # CartPole's DQN MLP
    assert small.device == torch.device("cpu") and small.reason == "auto: small network"
    assert "4,610 parameters, fewer than 100,000: faster on the CPU" in small.detail
    big = choose_device("auto", lambda: GPU, lambda: 1_686_180)  # the Nature CNN
    assert big.device == torch.device("cuda") and big.reason == "auto: CUDA"
    assert "cuda:0 (NVIDIA H100) usable" in big.detail
    edge = choose_device("auto", lambda: GPU, lambda: AUTO_CUDA_MIN_PARAMETERS)
    assert edge.device.type == "cuda"
    assert choose_device("auto", lambda: GPU, lambda: AUTO_CUDA_MIN_PARAMETERS - 1).device.type == "cpu"


def test_auto_without_cuda_says_why_and_builds_nothing() -> None:
    choice = choose_device("auto", lambda: NONE, never)
    assert choice.device == torch.device("cpu") and choice.reason == "auto: no CUDA"
    assert choice.detail == "learner.device=auto and torch 2.13.0+cpu has no CUDA"


def test_a_device_asked_for_is_kept_or_refused_with_the_probe_s_reason() -> None:
    assert choose_device("cpu", never, never).device == torch.device("cpu")
    asked = choose_device("cuda:1", lambda: GPU, never)
    assert asked.device == torch.device("cuda:1") and asked.reason == "asked"
    with pytest.raises(ValueError, match=r"device 'cuda' requested but torch 2.13.0\+cpu has no CUDA; "
                                         r"use 'auto' or 'cpu'"):
        choose_device("cuda", lambda: NONE, never)


def test_the_real_probe_on_this_torch() -> None:
    probe = probe_cuda()
    if torch.version.cuda is None:  # this machine's wheel: the probe names it
        assert probe == CudaProbe(False, f"torch {torch.__version__} has no CUDA")
    else:
        assert probe.usable == torch.cuda.is_available()


def test_a_driver_too_old_is_named_with_both_versions() -> None:
    said = driver_too_old_message(11040, "12.8", "2.13.0+cu128")
    assert said.startswith("learner: the NVIDIA driver here supports CUDA 11.4 (driver API version 11040), "
                           "and this torch (2.13.0+cu128) was built for CUDA 12.8")
    assert "set learner.device=cpu" in said
    assert "an older CUDA (torch did not say which)" in driver_too_old_message(None, "12.8", "2.13.0+cu128")


def test_a_learner_says_and_exports_its_device(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = load(str(CONFIGS / "cartpole-dqn.yaml"), environ={}, sets=[
        f"run_dir={tmp_path}", f"network.replay=[tcp://127.0.0.1:{free_tcp_port()}]",
        f"network.paramserver=[tcp://127.0.0.1:{free_tcp_port()}]", "evaluator.enabled=false"])
    expected = probe_cuda()
    with replay_and_paramserver(cfg), caplog.at_level(logging.INFO, logger="rlfleet.learner"):
        learner = LearnerService(cfg)
        try:
            exported = generate_latest(learner.metrics.registry).decode()
        finally:
            learner.trainer.close()
            learner.publisher.close()
    if not expected.usable:  # this machine: a CPU torch
        reason = "auto: no CUDA"
        assert f"learner: trains on cpu (auto: no CUDA): learner.device=auto and {expected.why}" in caplog.text
    else:  # CartPole's MLP is a small network wherever it runs
        reason = "auto: small network"
        assert "learner: trains on cpu (auto: small network)" in caplog.text
    lines = [line for line in exported.splitlines() if line.startswith("rlfleet_learner_device_info{")]
    assert len(lines) == 1 and 'device="cpu"' in lines[0] and f'reason="{reason}"' in lines[0], lines
    assert lines[0].endswith(" 1.0")
