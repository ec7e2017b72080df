"""Published weights: a network's state_dict as named float32 arrays, and back, checked."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from rlfleet.common.algorithms.device import to_device


def publish_arrays(net: torch.nn.Module, prefix: str = "") -> dict[str, np.ndarray]:
    """CPU float32 C-contiguous copies of ``net``'s state_dict, names prefixed with ``prefix``."""
    return {
        prefix + key: np.ascontiguousarray(value.detach().to("cpu", torch.float32, copy=True).numpy())
        for key, value in net.state_dict().items()
    }


def check_arrays(own: Mapping[str, tuple[int, ...]], arrays: Mapping[str, np.ndarray]) -> None:
    """Raise ValueError unless ``arrays`` has exactly the names of ``own``, each of its shape."""
    missing = sorted(set(own) - set(arrays))
    extra = sorted(set(arrays) - set(own))
    if missing or extra:
        raise ValueError(f"weights do not fit the network: missing {missing}, unexpected {extra}")
    for key, want in own.items():
        shape = tuple(np.shape(arrays[key]))
        if shape != tuple(want):
            raise ValueError(f"weights {key!r} have shape {shape}; the network needs {tuple(want)}")


def unprefixed(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays of ``arrays`` named ``prefix...``, without the prefix (what :func:`publish_arrays` added);
    ValueError for any other name: published weights hold nothing else."""
    extra = sorted(key for key in arrays if not key.startswith(prefix))
    if extra:
        raise ValueError(f"weights do not fit the network: unexpected {extra} (every name starts with {prefix!r})")
    return {key[len(prefix):]: value for key, value in arrays.items()}


def load_arrays(net: torch.nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Copy named arrays into ``net``'s state_dict after checking names and shapes.

    Weights come from the wire: a mismatch is a clear error and leaves the net
    untouched.
    """
    own = net.state_dict()
    check_arrays({key: tuple(tensor.shape) for key, tensor in own.items()}, arrays)
    with torch.no_grad():
        for key, tensor in own.items():
            tensor.copy_(to_device(np.asarray(arrays[key]), torch.device("cpu")))
