"""A torch generator in a checkpoint that moves between devices.

A CPU generator's state is a Mersenne Twister's (5056 bytes); a CUDA generator's is Philox's seed
and offset (16 bytes): neither loads into the other ("Expected a CPUGeneratorImplState of size
5056 but found 16"), and the two draw different numbers from the same seed anyway. A learner's
checkpoint therefore holds its generator's state with the device type it came from
(:func:`generator_state`); :func:`restore_generator` restores it where the kinds match and
otherwise re-seeds this device's generator from it deterministically (the SHA-256 of the saved
state: the same checkpoint resumed twice on the other device draws the same stream), saying so
in the log. A checkpoint from before the device tag is recognised by its state's size.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any, Literal

import torch

log = logging.getLogger("rlfleet.learner")

Plan = Literal["restore", "reseed"]


def generator_state(gen: torch.Generator, key: str = "generator") -> dict[str, Any]:
    """``{key: the state (a CPU uint8 tensor), key_device: "cpu"/"cuda"}`` for a checkpoint."""
    return {key: gen.get_state().cpu(), f"{key}_device": gen.device.type}


def plan(saved_bytes: int, saved_device: str | None, own_device: str, own_bytes: int) -> Plan:
    """Whether a saved generator state loads into this generator as it is ("restore": same device
    type and size) or this generator is re-seeded from it ("reseed"). Untagged (older checkpoints):
    by size alone."""
    same_kind = saved_device is None or saved_device == own_device
    return "restore" if same_kind and saved_bytes == own_bytes else "reseed"


def reseed_from(saved: torch.Tensor) -> int:
    """The seed a foreign generator state gives: the first 8 bytes of its SHA-256, as a 63-bit int."""
    digest = hashlib.sha256(saved.cpu().contiguous().numpy().tobytes()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def restore_generator(gen: torch.Generator, state: Mapping[str, Any], key: str = "generator") -> Plan:
    """Load ``state[key]`` into ``gen``, or re-seed ``gen`` from it where it is another device's."""
    saved = state[key]
    if not isinstance(saved, torch.Tensor) or saved.dtype != torch.uint8 or saved.dim() != 1:
        raise ValueError(f"checkpoint's {key!r} is not a generator state (a 1-d uint8 tensor): "
                         f"{type(saved).__name__}")
    saved_device = state.get(f"{key}_device")
    if saved_device is not None and saved_device not in ("cpu", "cuda"):
        raise ValueError(f"checkpoint's {key}_device={saved_device!r}; allowed: 'cpu', 'cuda'")
    own = gen.get_state()
    what = plan(saved.numel(), saved_device, gen.device.type, own.numel())
    if what == "restore":
        gen.set_state(saved.to(own.device))
        return what
    seed = reseed_from(saved)
    gen.manual_seed(seed)
    log.warning("learner: the checkpoint's %s generator state (%d bytes) cannot drive this %s generator "
                "(%d bytes): re-seeded from it deterministically (seed %d); its draws differ from the "
                "other device's, as they would with the same seed", saved_device or "untagged", saved.numel(),
                gen.device.type, own.numel(), seed)
    return what
