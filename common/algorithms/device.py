"""Device choice, host-to-device batches and seeding, shared by every algorithm."""

from __future__ import annotations

import random
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

ArrayLike = np.ndarray | torch.Tensor


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """'auto' -> CUDA when present, else CPU; 'cpu', 'cuda', 'cuda:N' as given.

    Asking for CUDA on a machine without it is an error that says so, rather
    than a crash deep inside the first update.
    """
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but torch has no CUDA here; use 'auto' or 'cpu'")
    return device


def native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 convolutions and matmuls natively: a CPU with AVX512-BF16 or AMX
    (oneDNN's check; emulated elsewhere, slower than float32), a CUDA device that supports it."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the check: assume emulation
        return False


def use_bfloat16(setting: str, device: torch.device, auto: bool = True) -> bool:
    """A ``*_dtype`` setting ("float32", "bfloat16", "auto") decided for ``device``: "auto" is bfloat16 where
    ``auto`` holds (the caller's own condition) and the device computes it natively."""
    return setting == "bfloat16" or (setting == "auto" and auto and native_bfloat16(device))


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing memory with ``array``.

    Arrays decoded from the wire are read-only views of the message frames;
    torch warns about those because it cannot enforce read-only tensors. The
    algorithms only read their inputs, so the warning is noise here.
    """
    array = np.ascontiguousarray(array)
    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def to_device(value: ArrayLike, device: torch.device) -> torch.Tensor:
    """Move one array to ``device``; on CUDA through pinned memory, non-blocking."""
    tensor = value if isinstance(value, torch.Tensor) else from_numpy(np.asarray(value))
    if tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def batch_to_device(batch: Mapping[str, ArrayLike], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: to_device(value, device) for key, value in batch.items()}


def columns_to_device(batch: Mapping[str, ArrayLike], columns: Sequence[str], device: torch.device,
                      algorithm: str) -> dict[str, torch.Tensor]:
    """``columns`` of ``batch`` on ``device``; a KeyError naming what is missing and what ``algorithm`` needs."""
    missing = [key for key in columns if key not in batch]
    if missing:
        raise KeyError(f"batch has no column(s) {missing}; {algorithm} needs {', '.join(columns)}")
    return batch_to_device({key: batch[key] for key in columns}, device)


def seed_everything(seed: int) -> np.random.Generator:
    """Seed torch (CPU and CUDA) and Python's random; return a numpy Generator.

    With the same seed, CPU runs repeat exactly; CUDA kernels may not.
    """
    random.seed(seed)
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


def cpu_copy(tree: Any) -> Any:
    """Deep copy of a state tree with every tensor cloned to CPU.

    Checkpoints are written while training goes on: they must not share
    storage with tensors the optimizer keeps changing.
    """
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, Mapping):
        return {key: cpu_copy(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [cpu_copy(value) for value in tree]
    if isinstance(tree, tuple):
        return tuple(cpu_copy(value) for value in tree)
    return tree
