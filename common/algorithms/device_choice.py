"""Which device a learner trains on, and why, said out loud.

``learner.device`` is ``cpu``, ``cuda``/``cuda:N`` or ``auto``. The rule for ``auto``: CUDA when
torch can use a GPU here and the networks the learner publishes (``weights()``: what acting needs)
hold at least :data:`AUTO_CUDA_MIN_PARAMETERS` parameters; else CPU. Below that size (CartPole's
and the MuJoCo tasks' MLPs: thousands to tens of thousands) an update is a few dozen kernels of
microseconds each, and a GPU's launch latency and host-device copies cost more than the CPU spends
computing; the Nature CNN (1.7 M) and larger nets are where a GPU pays. Whether CUDA is usable
comes from :func:`probe_cuda`, which tells apart a torch built without CUDA, no visible device,
and a driver too old for this torch's CUDA: the last is an error naming both versions
(:func:`driver_too_old_message`), never a silent fall back to CPU. The learner logs the choice
with its reason and exports it (``rlfleet_learner_device_info{device, reason}``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

AUTO_CUDA_MIN_PARAMETERS = 100_000


class DriverTooOld(RuntimeError):
    """The NVIDIA driver here supports an older CUDA than the one this torch was built for."""


@dataclass(frozen=True)
class CudaProbe:
    usable: bool
    why: str  # "cuda:0 (NVIDIA H100)", "torch 2.13.0+cpu has no CUDA", ...


@dataclass(frozen=True)
class DeviceChoice:
    device: torch.device
    reason: str  # a short label: "asked", "auto: no CUDA", "auto: small network", "auto: CUDA"
    detail: str  # the sentence the log says


def driver_version_text(found: int) -> str:
    """A CUDA driver API version as the driver reports it (12040) in the usual form (12.4)."""
    return f"{found // 1000}.{found % 1000 // 10}"


def driver_too_old_message(found: int | None, built_for: str | None, torch_version: str) -> str:
    """What a learner says when the driver is too old for this torch's CUDA: both versions, and the ways out."""
    driver = f"CUDA {driver_version_text(found)} (driver API version {found})" if found is not None \
        else "an older CUDA (torch did not say which)"
    return (f"learner: the NVIDIA driver here supports {driver}, and this torch ({torch_version}) was built for "
            f"CUDA {built_for or '?'}: update the driver to one for CUDA {built_for or '?'} or newer, install a "
            "torch built for the driver's CUDA, or set learner.device=cpu to train on the CPU")


def probe_cuda() -> CudaProbe:
    """Whether torch can train on a GPU here, and why not; :class:`DriverTooOld` for a too-old driver
    (torch only warns about it and answers False)."""
    if torch.version.cuda is None:
        return CudaProbe(False, f"torch {torch.__version__} has no CUDA")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        usable = torch.cuda.is_available()
    for w in caught:
        text = str(w.message)
        if "too old" in text:
            found = re.search(r"found version (\d+)", text)
            raise DriverTooOld(driver_too_old_message(int(found.group(1)) if found else None, torch.version.cuda,
                                                      torch.__version__))
    if not usable:
        said = "; ".join(str(w.message).splitlines()[0] for w in caught)
        return CudaProbe(False, f"no CUDA device visible{': ' + said if said else ''}")
    return CudaProbe(True, f"cuda:0 ({torch.cuda.get_device_name(0)})")


def choose_device(setting: str, probe: Callable[[], CudaProbe], parameters: Callable[[], int]) -> DeviceChoice:
    """The device for ``learner.device=setting``. ``probe`` and ``parameters`` (the parameters the
    learner publishes, built on CPU) are asked only where ``auto`` needs them."""
    if setting != "auto":
        device = torch.device(setting)
        if device.type == "cuda":
            found = probe()
            if not found.usable:
                raise ValueError(f"device {setting!r} requested but {found.why}; use 'auto' or 'cpu'")
        return DeviceChoice(device, "asked", f"learner.device={setting}")
    found = probe()
    if not found.usable:
        return DeviceChoice(torch.device("cpu"), "auto: no CUDA", f"learner.device=auto and {found.why}")
    count = parameters()
    if count < AUTO_CUDA_MIN_PARAMETERS:
        return DeviceChoice(torch.device("cpu"), "auto: small network",
                            f"learner.device=auto, {found.why} usable, and the published networks hold {count:,} "
                            f"parameters, fewer than {AUTO_CUDA_MIN_PARAMETERS:,}: faster on the CPU")
    return DeviceChoice(torch.device("cuda"), "auto: CUDA",
                        f"learner.device=auto, {found.why} usable and the published networks hold {count:,} "
                        f"parameters (at least {AUTO_CUDA_MIN_PARAMETERS:,})")
