"""A shard's optimizer: torch's Adam, RMSprop and SGD update rules in numpy (the paramserver image
has no torch), stepping one flat float32 buffer that holds the shard's slice (:class:`FlatSlice`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfleet.common.config.sections import GradientsConfig


class FlatSlice:
    """A shard's tensors as views of one flat float32 buffer (sorted by name, each starting at a
    multiple of 8 bytes, zeros between): the optimizer then takes a handful of numpy passes over one
    array per push, whatever the number of tensors. It is laid out as a packed message's payload
    (docs/protocol.md), so a packed push of the slice in name order is the flat gradient itself."""

    def __init__(self, arrays: Mapping[str, Any]) -> None:
        self.names = sorted(arrays)
        self.shapes = [tuple(np.shape(arrays[n])) for n in self.names]
        self.offsets: list[int] = []  # in floats
        end = 0
        for shape in self.shapes:
            end += end % 2  # 8-byte alignment: 2 floats
            self.offsets.append(end)
            end += int(np.prod(shape, dtype=np.int64))
        self.ends = [o + int(np.prod(s, dtype=np.int64)) for o, s in zip(self.offsets, self.shapes, strict=True)]
        self.size = end
        self._packed: Any = None  # the last packed layout seen to match this one

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        return {n: flat[self.offsets[i]:self.ends[i]].reshape(self.shapes[i]) for i, n in enumerate(self.names)}

    def pack(self, arrays: Mapping[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        out = np.zeros(self.size, np.float32) if out is None else out
        for i, n in enumerate(self.names):
            out[self.offsets[i]:self.ends[i]] = np.ravel(arrays[n])
        return out

    def payload(self, arrays: Mapping[str, np.ndarray], layout: Any) -> np.ndarray | None:
        """The packed payload of a decoded message as the flat array (no copy), if ``layout`` (its
        Message.layout) is this slice's layout; else None."""
        if layout is None or not arrays:
            return None
        if layout is not self._packed:
            items, total = layout
            want = [(n, np.dtype(np.float32), s, 4 * o) for n, s, o in zip(self.names, self.shapes, self.offsets,
                                                                         strict=True)]
            if [(n, d, tuple(s), o) for n, d, s, o in items] != want or total != 4 * self.size:
                return None
            self._packed = layout
        base = next(iter(arrays.values())).base
        return np.frombuffer(base, np.float32) if base is not None else None


class ShardOptimizer:
    """torch's Adam / RMSprop / SGD update rules, in place on one flat float32 array.

    Every pass writes into buffers kept between steps: a fresh temporary of a large slice
    would cost its page faults on every push."""

    SLOTS = {"adam": ("exp_avg", "exp_avg_sq"), "rmsprop": ("square_avg", "momentum_buffer"),
             "sgd": ("momentum_buffer",)}

    def __init__(self, cfg: GradientsConfig, size: int) -> None:
        self.cfg = cfg
        self.steps = 0
        slots = [s for s in self.SLOTS[cfg.optimizer] if s != "momentum_buffer" or cfg.momentum]
        self.state = {slot: np.zeros(size, np.float32) for slot in slots}
        self._tmp = np.empty(size, np.float32)
        self._denom = np.empty(size, np.float32) if cfg.optimizer != "sgd" else self._tmp

    def step(self, p: np.ndarray, g: np.ndarray) -> None:
        c, s, tmp, denom = self.cfg, self.state, self._tmp, self._denom
        self.steps += 1
        lr = c.lr_at(self.steps)
        if c.optimizer == "adam":
            b1, b2 = c.moment_decays
            m, v = s["exp_avg"], s["exp_avg_sq"]
            m *= b1
            np.multiply(g, 1 - b1, out=tmp)
            m += tmp
            v *= b2
            np.multiply(g, g, out=tmp)
            tmp *= 1 - b2
            v += tmp
            # torch: p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), the same as
            # p -= lr * sqrt(bc2) / bc1 * m / (sqrt(v) + eps * sqrt(bc2)): one pass less
            root_bc2 = np.sqrt(1 - b2 ** self.steps)
            np.sqrt(v, out=denom)
            denom += np.float32(c.eps * root_bc2)
            np.divide(m, denom, out=tmp)
            tmp *= np.float32(lr * root_bc2 / (1 - b1 ** self.steps))
        elif c.optimizer == "rmsprop":
            sq = s["square_avg"]
            sq *= c.alpha
            np.multiply(g, g, out=tmp)
            tmp *= 1 - c.alpha
            sq += tmp
            np.sqrt(sq, out=denom)
            denom += np.float32(c.eps)
            np.divide(g, denom, out=tmp)
            if c.momentum:
                buf = s["momentum_buffer"]
                buf *= c.momentum
                buf += tmp
                np.multiply(buf, np.float32(lr), out=tmp)
            else:
                tmp *= np.float32(lr)
        else:
            if c.momentum:
                buf = s["momentum_buffer"]
                if self.steps == 1:
                    buf[...] = g  # torch: the first step's buffer is the gradient itself
                else:
                    buf *= c.momentum
                    buf += g
                g = buf
            np.multiply(g, np.float32(lr), out=tmp)
        p -= tmp
