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


class HostStaging:
    """Reusable host buffers through which a batch's columns reach a CUDA device, and the way back.

    ``tensor.pin_memory()`` per column per update allocates page-locked memory each time (a
    driver call far slower than the copy); here each column name has one buffer, allocated once and
    grown only when a batch's column needs more bytes, filled with the column and copied to the
    device with ``non_blocking=True``. A buffer is refilled only after the copy that last read it
    has finished (a CUDA event per batch). On any other device nothing is staged:
    :meth:`to_device` makes tensors of the arrays as :func:`to_device` does (on CPU they share
    the arrays' memory). ``staged``/``pin`` (default: on CUDA only) force the staging path and the
    pinning apart, so the staging's reuse and growth are testable without CUDA. Where batches are staged,
    an update's figures and priorities come back in one copy (:meth:`to_host`).
    """

    def __init__(self, device: torch.device, staged: bool | None = None, pin: bool | None = None) -> None:
        self.device = device
        self.staged = device.type == "cuda" if staged is None else staged
        self.pin = device.type == "cuda" if pin is None else pin
        self.buffers: dict[str, torch.Tensor] = {}  # bytes (uint8), viewed as each column's dtype and shape
        self.allocations = 0
        self._copied: dict[str, Any] = {}  # name -> the CUDA event after the last copy out of its buffer

    def stage(self, name: str, value: ArrayLike) -> torch.Tensor:
        """``value`` copied into the buffer of ``name`` (grown if too small), as a tensor of its dtype and shape."""
        source = value if isinstance(value, torch.Tensor) else from_numpy(np.asarray(value))
        nbytes = source.numel() * source.element_size()
        buffer = self.buffers.get(name)
        if buffer is None or buffer.numel() < nbytes:
            buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=self.pin)
            self.buffers[name] = buffer
            self.allocations += 1
        elif name in self._copied:
            self._copied.pop(name).synchronize()  # the last copy out of it has finished before it is overwritten
        host = buffer[:nbytes].view(source.dtype).view(source.shape)
        host.copy_(source)
        return host

    def to_device(self, columns: Mapping[str, ArrayLike]) -> dict[str, torch.Tensor]:
        """Every column on the device: through its buffer, non-blocking, where the device is CUDA."""
        if not self.staged:
            return batch_to_device(columns, self.device)
        out: dict[str, torch.Tensor] = {}
        staged = []
        for name, value in columns.items():
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                out[name] = value.to(self.device, non_blocking=True)
                continue
            out[name] = self.stage(name, value).to(self.device, non_blocking=True)
            staged.append(name)
        if staged and self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))  # the copies' stream: the target device's
            self._copied.update(dict.fromkeys(staged, event))
        return out

    def to_host(self, figures: torch.Tensor, priorities: torch.Tensor) -> tuple[list[float], np.ndarray]:
        """:func:`to_host`: one copy for both where batches are staged (CUDA), none on CPU."""
        return to_host(figures, priorities, packed=self.staged)

    def columns(self, batch: Mapping[str, ArrayLike], columns: Sequence[str], algorithm: str,
                weights: ArrayLike | None = None) -> dict[str, torch.Tensor]:
        """``columns`` of ``batch`` (and the importance ``weights`` as ``"weights"``) on the device; a KeyError
        naming what is missing and what ``algorithm`` needs."""
        missing = [key for key in columns if key not in batch]
        if missing:
            raise KeyError(f"batch has no column(s) {missing}; {algorithm} needs {', '.join(columns)}")
        chosen = {key: batch[key] for key in columns}
        if weights is not None:
            chosen["weights"] = weights
        return self.to_device(chosen)


def to_host(figures: torch.Tensor, priorities: torch.Tensor, packed: bool | None = None
            ) -> tuple[list[float], np.ndarray]:
    """An update's figures (a 1-D tensor) as floats and its priorities as float64, in one device-to-host copy.

    On a device (``packed``, the default off the CPU) both go into one float64 tensor, copied once: one
    synchronisation per update instead of one per ``.cpu()``. On CPU nothing is copied but the
    priorities' cast to float64. Both give the same values (float32 figures are exact in float64).
    """
    if packed is None:
        packed = figures.device.type != "cpu"
    if not packed:
        return figures.cpu().tolist(), priorities.double().cpu().numpy()
    both = torch.cat([figures.detach().double().reshape(-1), priorities.detach().double().reshape(-1)]).cpu()
    n = figures.numel()
    return both[:n].tolist(), both[n:].numpy().reshape(priorities.shape)


def batch_to_device(batch: Mapping[str, ArrayLike], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: to_device(value, device) for key, value in batch.items()}


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
