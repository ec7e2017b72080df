"""A shard's optimizer: gradient pushes from workers applied to its slice of the weights.

Gorila's parameter server, and the shared network of HogWild/A3C made safe: a
worker computes gradients on its own experience against the weights version it
holds and pushes this shard's slice of them (``push_gradients``); the shard
checks them, steps its optimizer on its own float32 copy of the slice and keeps
the result as its next version. numpy only: the paramserver image has no torch.
The update rules are torch's (Adam, RMSprop, SGD with momentum), so a worker's
gradient gives the same step here as in a torch optimizer (tests compare them).

Checks before anything is applied, all or nothing: the layout is the shard's,
every tensor of the slice is there with its shape and float32, every value is
finite, the version is one the shard has held (never from the future) and at
most ``max_staleness`` versions behind its newest. A refused push changes
nothing. A push is applied at most once per (sender, seq) (common/wire/dedup.py):
a worker resends a push whose reply it lost, and the resend is answered as a
duplicate.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.config.sections import GradientsConfig
from common.tensor_shards import Layout
from common.wire.codec import Message
from common.wire.dedup import Dedup


class ShardOptimizer:
    """torch's Adam / RMSprop / SGD update rules in place on named float32 arrays."""

    def __init__(self, cfg: GradientsConfig, params: Mapping[str, np.ndarray]) -> None:
        self.cfg = cfg
        self.steps = 0
        self.state: dict[str, dict[str, np.ndarray]] = {}
        for name, p in params.items():
            slots: dict[str, np.ndarray] = {}
            if cfg.optimizer == "adam":
                slots = {"exp_avg": np.zeros_like(p), "exp_avg_sq": np.zeros_like(p)}
            elif cfg.optimizer == "rmsprop":
                slots = {"square_avg": np.zeros_like(p)}
                if cfg.momentum:
                    slots["momentum_buffer"] = np.zeros_like(p)
            elif cfg.momentum:
                slots = {"momentum_buffer": np.zeros_like(p)}
            self.state[name] = slots

    def step(self, params: dict[str, np.ndarray], grads: Mapping[str, np.ndarray]) -> None:
        c = self.cfg
        self.steps += 1
        for name, p in params.items():
            g = grads[name]
            s = self.state[name]
            if c.optimizer == "adam":
                b1, b2 = c.betas
                m, v = s["exp_avg"], s["exp_avg_sq"]
                m *= b1
                m += (1 - b1) * g
                v *= b2
                v += (1 - b2) * np.square(g)
                bias1 = 1 - b1 ** self.steps
                bias2 = 1 - b2 ** self.steps
                denom = np.sqrt(v) / np.float32(np.sqrt(bias2))
                denom += np.float32(c.eps)
                p -= np.float32(c.lr / bias1) * (m / denom)
            elif c.optimizer == "rmsprop":
                sq = s["square_avg"]
                sq *= c.alpha
                sq += (1 - c.alpha) * np.square(g)
                denom = np.sqrt(sq)
                denom += np.float32(c.eps)
                if c.momentum:
                    buf = s["momentum_buffer"]
                    buf *= c.momentum
                    buf += g / denom
                    p -= np.float32(c.lr) * buf
                else:
                    p -= np.float32(c.lr) * (g / denom)
            else:
                if c.momentum:
                    buf = s["momentum_buffer"]
                    if self.steps == 1:
                        buf[...] = g  # torch: the first step's buffer is the gradient itself
                    else:
                        buf *= c.momentum
                        buf += g
                    g = buf
                p -= np.float32(c.lr) * g

    def arrays(self) -> dict[str, np.ndarray]:
        """The state as flat named arrays (for a checkpoint): ``<slot>/<tensor>``."""
        return {f"{slot}/{name}": a for name, slots in self.state.items() for slot, a in slots.items()}

    def load_arrays(self, arrays: Mapping[str, np.ndarray], steps: int) -> None:
        for name, slots in self.state.items():
            for slot, a in slots.items():
                a[...] = arrays[f"{slot}/{name}"]
        self.steps = steps


@dataclass
class Refusal(Exception):
    reason: str
    detail: str


def check_push(
    slice_specs: list[tuple[str, str, tuple[int, ...]]],
    arrays: Mapping[str, np.ndarray],
    version: int,
    versions: list[int],
    max_staleness: int,
) -> int:
    """The push's staleness (newest held version minus ``version``), or raise :class:`Refusal`."""
    if not versions:
        raise Refusal("no_weights", "this shard holds no weights yet: a worker publishes the initial weights"
                      " first (publish), then pushes gradients computed on them")
    newest = versions[0]
    if version > newest:
        raise Refusal("unknown_version", f"gradients computed on version {version}; this shard's newest is"
                      f" {newest} (a version it never held)")
    want = {n: (d, s) for n, d, s in slice_specs}
    missing = sorted(set(want) - set(arrays))
    if missing:
        raise Refusal("bad_gradients", f"push lacks the gradient of {missing[0]!r} ({len(missing)} missing);"
                      f" this shard holds {sorted(want)}")
    extra = sorted(set(arrays) - set(want))
    if extra:
        raise Refusal("bad_gradients", f"gradient {extra[0]!r} is not a tensor of this shard; it holds {sorted(want)}")
    for name, (dtype, shape) in want.items():
        g = arrays[name]
        if g.dtype != np.float32 or tuple(g.shape) != shape:
            raise Refusal("bad_gradients", f"gradient {name!r} is {g.dtype}{list(g.shape)}; allowed:"
                          f" float32{list(shape)} (the weights' dtype is {dtype})")
        if not np.isfinite(g).all():
            bad = int(np.count_nonzero(~np.isfinite(g)))
            raise Refusal("bad_gradients", f"gradient {name!r} has {bad} NaN or Inf values; nothing applied")
    staleness = newest - version
    if staleness > max_staleness:
        raise Refusal("stale_gradients", f"gradients computed on version {version}, {staleness} versions behind"
                      f" the newest ({newest}); allowed: at most {max_staleness} (paramserver.gradients."
                      "max_staleness); pull the newest weights")
    return staleness


class SliceTrainer:
    """The shard's own copy of its slice and the optimizer stepping it."""

    def __init__(self, cfg: GradientsConfig) -> None:
        self.cfg = cfg
        self.version = -1  # the version ``params`` holds
        self.params: dict[str, np.ndarray] = {}
        self.optimizer: ShardOptimizer | None = None

    def follow(self, version: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Start from ``arrays`` (a version published by a learner or a worker), keeping optimizer state
        when the tensors are the same."""
        if self.version == version:
            return
        params = {n: np.array(a, dtype=np.float32, copy=True) for n, a in arrays.items()}
        if self.optimizer is None or set(params) != set(self.params):
            self.optimizer = ShardOptimizer(self.cfg, params)
        self.params = params
        self.version = version

    def apply(self, grads: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Step once; the new slice (copies: the shard keeps them as a read-only version)."""
        assert self.optimizer is not None
        self.optimizer.step(self.params, grads)
        self.version += 1
        out = {n: p.copy() for n, p in self.params.items()}
        for a in out.values():
            a.flags.writeable = False
        return out

    def state(self) -> dict[str, Any]:
        assert self.optimizer is not None
        return {"version": self.version, "steps": self.optimizer.steps, "params": self.params,
                "optimizer": self.optimizer.arrays()}

    def load(self, version: int, steps: int, params: Mapping[str, np.ndarray],
             optimizer: Mapping[str, np.ndarray]) -> None:
        self.params = {n: np.array(a, dtype=np.float32, copy=True) for n, a in params.items()}
        self.optimizer = ShardOptimizer(self.cfg, self.params)
        self.optimizer.load_arrays(optimizer, steps)
        self.version = version


class GradientApplier:
    """What a shard does with ``push_gradients``: dedup, checks, the optimizer step, checkpoints.

    The checkpoint (``path``, an .npz written atomically, read with allow_pickle=False) holds the
    shard's slice, its optimizer state and step count, the version, the layout and which
    (sender, seq) pushes were applied, so a restarted shard serves the same version, steps on
    with the same moments and still answers a resend as a duplicate.
    """

    def __init__(self, cfg: GradientsConfig, path: str | None, shard: int) -> None:
        self.cfg = cfg
        self.path = path
        self.shard = shard
        self.trainer = SliceTrainer(cfg)
        self.dedup = Dedup(10_000, service=f"paramserver shard {shard}", what="push")
        self.dirty = False  # applied since the last checkpoint
        self.next_checkpoint = time.monotonic() + cfg.checkpoint_every_s

    def push(self, msg: Message, layout: Layout, versions: list[int],
             newest: Mapping[str, np.ndarray] | None) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
        """The ``gradients_ack`` body and, if the push was applied, the new slice; raises Refusal."""
        sender, seq, version = msg.sender, msg.seq, msg["version"]
        if not sender:
            raise Refusal("bad_gradients", "push_gradients needs a sender (the worker's id): a push is applied"
                          " once per (sender, seq)")
        refusal = self.dedup.refusal(sender, seq)
        if refusal is not None:
            raise Refusal(*refusal)
        if self.dedup.seen(sender, seq):
            return {"version": versions[0] if versions else -1, "applied": False, "duplicate": True,
                    "staleness": 0}, None
        staleness = check_push(layout.shard_specs(self.shard), msg.arrays, version, versions, self.cfg.max_staleness)
        assert newest is not None
        self.trainer.follow(versions[0], newest)
        new = self.trainer.apply(msg.arrays)
        self.dedup.add(sender, seq)
        self.dirty = True
        return {"version": self.trainer.version, "applied": True, "duplicate": False, "staleness": staleness}, new

    # -- checkpoints ----------------------------------------------------------
    def due(self, now: float) -> bool:
        return self.dirty and self.path is not None and now >= self.next_checkpoint

    def save(self, layout: Layout) -> None:
        """Write the checkpoint (atomically) if anything was applied since the last one."""
        if not self.dirty or self.path is None:
            return
        state = self.trainer.state()
        meta = {"version": state["version"], "steps": state["steps"], "num_shards": layout.num_shards,
                "tensors": layout.to_wire(), "dedup": self.dedup.state()}
        arrays = {f"param/{n}": a for n, a in state["params"].items()}
        arrays.update({f"opt/{n}": a for n, a in state["optimizer"].items()})
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.dirty = False
        self.next_checkpoint = time.monotonic() + self.cfg.checkpoint_every_s

    def load(self, num_shards: int) -> tuple[Layout, int, dict[str, np.ndarray]] | None:
        """(layout, version, slice) from the checkpoint, or None when there is none.

        Raises ValueError naming the file when it is unreadable or for another shard count."""
        if self.path is None or not os.path.exists(self.path):
            return None
        try:
            with np.load(self.path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            meta = json.loads(arrays.pop("meta").tobytes())
            if meta["num_shards"] != num_shards:
                raise ValueError(f"it was written for {meta['num_shards']} shards; paramserver.shards is {num_shards}")
            layout = Layout.from_wire(meta["tensors"], num_shards)
            params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
            opt = {k[len("opt/"):]: v for k, v in arrays.items() if k.startswith("opt/")}
            problem = layout.check_shard(self.shard, params)
            if problem:
                raise ValueError(problem)
            self.trainer.load(int(meta["version"]), int(meta["steps"]), params, opt)
            self.dedup.restore(meta["dedup"])
        except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"paramserver checkpoint {self.path} cannot be read: {exc}") from None
        out = {n: p.copy() for n, p in self.trainer.params.items()}
        return layout, self.trainer.version, out
