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
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet.common.config.sections import DEFAULT_MAX_GRADIENT_NORM, GradientsConfig
from rlfleet.common.tensor_shards import Layout
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.dedup import Dedup
from rlfleet.common.wire.schema import INT64_MAX, PUBLISHED_RANGE, range_text
from rlfleet.common.wire.server import Peer
from rlfleet.services.paramserver.gradient_rounds import MAX_SENDERS_PER_ACTOR, GradientRound, RoundPush, actor_of
from rlfleet.services.paramserver.shard_optimizer import FlatSlice, ShardOptimizer

log = logging.getLogger(__name__)


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
    tensors: bool = True,
    first: int | None = None,
) -> int:
    """The push's staleness (newest held version minus ``version``), or raise :class:`Refusal`.
    ``first``: the oldest version this shard has held (a push on an older one is on weights it never had)."""
    if not versions:
        raise Refusal("no_weights", "this shard holds no weights yet: a worker publishes the initial weights"
                      " first (publish), then pushes gradients computed on them")
    newest = versions[0]
    oldest = versions[-1] if first is None else min(first, versions[-1])
    if not oldest <= version <= newest:
        raise Refusal("unknown_version", f"gradients computed on version {version}; this shard has held versions"
                      f" {oldest} to {newest} only (a version it never held)")
    if newest >= INT64_MAX:
        raise Refusal("bad_field", f"this shard's newest version is {newest}, the largest a version may be"
                      f" ({range_text(PUBLISHED_RANGE)}): no push can make a newer one")
    if tensors:
        check_tensors(slice_specs, arrays)
    staleness = newest - version
    if staleness > max_staleness:
        raise Refusal("stale_gradients", f"gradients computed on version {version}, {staleness} versions behind"
                      f" the newest ({newest}); allowed: at most {max_staleness} (paramserver.gradients."
                      "max_staleness); pull the newest weights")
    return staleness


def check_tensors(slice_specs: list[tuple[str, str, tuple[int, ...]]], arrays: Mapping[str, np.ndarray]) -> None:
    """Raise :class:`Refusal` unless ``arrays`` are the slice's tensors, each float32 of its shape."""
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


class SliceTrainer:
    """The shard's own copy of its slice (one flat buffer) and the optimizer stepping it.

    A push is refused, with nothing changed, if its gradient holds a NaN or an Inf, if its L2 norm
    exceeds ``max_norm``, or if stepping with it leaves the weights or the optimizer state
    non-finite (then both are put back as they were)."""

    def __init__(self, cfg: GradientsConfig, max_norm: float = DEFAULT_MAX_GRADIENT_NORM) -> None:
        self.cfg = cfg
        self.max_norm = max_norm
        self.version = -1  # the version ``params`` holds
        self.flat: FlatSlice | None = None
        self.params = np.empty(0, np.float32)
        self.grads = np.empty(0, np.float32)
        self.optimizer: ShardOptimizer | None = None
        self._backup: list[np.ndarray] = []  # params and optimizer state before a step, to put back

    def follow(self, version: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Start from ``arrays`` (a version published by a learner or a worker), keeping optimizer state
        when the tensors are the same."""
        if self.version == version:
            return
        if self.flat is None or self.flat.names != sorted(arrays) or self.flat.shapes != [
                tuple(np.shape(arrays[n])) for n in self.flat.names]:
            self.flat = FlatSlice(arrays)
            self.optimizer = ShardOptimizer(self.cfg, self.flat.size)
            self.grads = np.zeros(self.flat.size, np.float32)  # the padding between tensors stays 0
            self._backup = []
        self.params = self.flat.pack(arrays)
        self.version = version

    def gather(self, grads: Mapping[str, np.ndarray], out: np.ndarray | None = None,
               packed: Any = None) -> np.ndarray:
        """``grads`` as one flat array (the packed payload itself when ``packed``, the message's layout,
        is the slice's; else copied into ``out``, or the trainer's buffer); raises Refusal if one holds a
        NaN or an Inf, or if their L2 norm exceeds ``max_norm``."""
        assert self.flat is not None
        g = self.flat.payload(grads, packed) if out is None else None
        if g is None:
            g = self.flat.pack(grads, self.grads if out is None else out)
        # one pass: a NaN or an Inf makes the sum of squares non-finite; so can a float32 overflow of
        # finite values (a norm far above any bound), which the exact check then tells apart
        with np.errstate(over="ignore", invalid="ignore"):
            squares = float(np.dot(g, g))
        if squares <= self.max_norm ** 2:
            return g
        if g is not self.grads and g is not out:  # the payload's padding counted: the tensors alone, copied
            return self.gather(grads, self.grads if out is None else out)
        name = next((n for n in self.flat.names if not np.isfinite(grads[n]).all()), None)
        if name is not None:
            bad = int(np.count_nonzero(~np.isfinite(grads[name])))
            raise Refusal("bad_gradients", f"gradient {name!r} has {bad} NaN or Inf values; nothing applied")
        raise Refusal("bad_gradients", f"the gradients' L2 norm is {np.sqrt(squares):.4g}; allowed: at most"
                      f" {self.max_norm:g} (paramserver.max_gradient_norm, the norm of this shard's slice);"
                      " nothing applied")

    def apply(self, grads: Mapping[str, np.ndarray], packed: Any = None) -> dict[str, np.ndarray]:
        """Step once; the new slice as read-only views of one copy (the shard keeps it as a version).
        Raises Refusal, with nothing changed, if a gradient holds a NaN or an Inf."""
        return self.step(self.gather(grads, packed=packed))

    def step(self, g: np.ndarray) -> dict[str, np.ndarray]:
        """Step once with the flat gradient ``g``; the new slice, as :meth:`apply`. Raises Refusal, with
        the weights and optimizer state put back, if the step left either non-finite."""
        assert self.optimizer is not None and self.flat is not None
        kept = [self.params, *self.optimizer.state.values()]
        if not self._backup:
            self._backup = [np.empty_like(a) for a in kept]
        for a, b in zip(kept, self._backup, strict=True):
            np.copyto(b, a)
        with np.errstate(over="ignore", invalid="ignore"):  # what overflows is undone below
            self.optimizer.step(self.params, g)
        if not all(finite(a) for a in kept):
            for a, b in zip(kept, self._backup, strict=True):
                np.copyto(a, b)
            self.optimizer.steps -= 1
            raise Refusal("bad_gradients", "stepping the optimizer with these gradients made the weights or its"
                          " state non-finite; both are as they were, nothing applied")
        self.version += 1
        out = self.params.copy()
        out.flags.writeable = False
        return self.flat.views(out)

    def state(self) -> dict[str, Any]:
        assert self.optimizer is not None and self.flat is not None
        opt = {f"{slot}/{n}": v for slot, a in self.optimizer.state.items() for n, v in self.flat.views(a).items()}
        return {"version": self.version, "steps": self.optimizer.steps, "params": self.flat.views(self.params),
                "optimizer": opt}

    def load(self, version: int, steps: int, params: Mapping[str, np.ndarray],
             optimizer: Mapping[str, np.ndarray]) -> None:
        self.version = -1
        self.flat = None
        self.follow(version, params)
        assert self.optimizer is not None and self.flat is not None
        for slot, a in self.optimizer.state.items():
            self.flat.pack({n: optimizer[f"{slot}/{n}"] for n in self.flat.names}, a)
        self.optimizer.steps = steps


def finite(a: np.ndarray) -> bool:
    """Every value of ``a`` finite (one pass when they are: a sum overflows only if some value is huge)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(a.sum()) or np.isfinite(a).all())


class GradientApplier:
    """What a shard does with ``push_gradients``: dedup, checks, the optimizer step, checkpoints.

    The checkpoint (``path``, an .npz written atomically, read with allow_pickle=False) holds the
    shard's slice, its optimizer state and step count, the version, the layout and which
    (sender, seq) pushes were applied, so a restarted shard serves the same version, steps on
    with the same moments and still answers a resend as a duplicate.
    """

    def __init__(self, cfg: GradientsConfig, path: str | None, shard: int, experiment: str = "",
                 max_gradient_norm: float = DEFAULT_MAX_GRADIENT_NORM) -> None:
        self.cfg = cfg
        self.path = path
        self.experiment = experiment  # a checkpoint of another experiment (same run_dir) is not restored
        self.shard = shard
        self.trainer = SliceTrainer(cfg, max_gradient_norm)
        self.dedup = Dedup(10_000, service=f"paramserver shard {shard}", what="push")
        self.dirty = False  # applied since the last checkpoint
        self._specs: tuple[Layout, list[tuple[str, str, tuple[int, ...]]]] | None = None  # this shard's tensors
        self._checked: Any = None  # the packed layout whose tensors passed check_tensors last
        self.next_checkpoint = time.monotonic() + cfg.checkpoint_every_s
        self.round = GradientRound()  # barrier: the pushes of the round being collected

    def push(self, msg: Message, layout: Layout, versions: list[int], newest: Mapping[str, np.ndarray] | None,
             peer: Peer | None = None, first: int | None = None,
             ) -> tuple[dict[str, Any] | None, dict[str, np.ndarray] | None]:
        """The ``gradients_ack`` body and, if the push was applied, the new slice; raises Refusal.

        A ``barrier`` push is held in the round (body None): :meth:`complete` answers it."""
        sender, seq, version = msg.sender, msg.seq, msg["version"]  # sender: never "" (the decoder's check)
        refusal = self.dedup.refusal(sender, seq)
        if refusal is not None:
            raise Refusal(*refusal)
        if self.dedup.seen(sender, seq):
            return {"version": versions[0] if versions else -1, "applied": False, "duplicate": True,
                    "staleness": 0}, None
        if self._specs is None or self._specs[0] is not layout:
            self._specs = (layout, layout.shard_specs(self.shard))
            self._checked = None
        barrier = bool(msg.get("barrier"))
        # a packed push whose decoded layout (names, dtypes, shapes: one object per layout) passed before
        # needs no second look at its tensors
        known = msg.layout is not None and msg.layout is self._checked
        staleness = check_push(self._specs[1], msg.arrays, version, versions, 0 if barrier else self.cfg.max_staleness,
                               tensors=not known, first=first)
        if msg.layout is not None:
            self._checked = msg.layout
        assert newest is not None
        self.trainer.follow(versions[0], newest)
        if barrier:
            assert peer is not None
            held = self.round.held(version, sender)  # the round slot is the full sender's, never another's
            actor = actor_of(sender)
            if held is None and self.round.senders_of(version, actor) >= MAX_SENDERS_PER_ACTOR:
                raise Refusal("busy", f"round {version} already holds {MAX_SENDERS_PER_ACTOR} pushes of senders"
                              f" naming actor {actor!r}; push again for the next round")
            grads = self.trainer.gather(msg.arrays)  # a refused push leaves a held contribution as it was
            if held is not None and held.grads.shape == grads.shape:
                np.copyto(held.grads, grads)
                grads = held.grads
            else:
                grads = grads.copy()
            self.round.add(version, RoundPush(peer, sender, seq, msg.get("window_start"), grads))
            return None, None
        new = self.trainer.apply(msg.arrays, msg.layout)
        self.dedup.add(sender, seq, msg.get("window_start"))
        self.dirty = True
        return {"version": self.trainer.version, "applied": True, "duplicate": False, "staleness": staleness}, new

    def complete(self, live: set[str]) -> tuple[list[tuple[Peer, dict[str, Any]]], dict[str, np.ndarray]] | None:
        """If every live worker (``live``: their registry ids; the round holds pushes of those only) pushed
        for the round: apply their mean once; (the held pushes' peers and acks, the new slice). None while
        the round waits."""
        if not self.round.ready(live):
            return None
        new = self.trainer.step(self.round.mean(self.trainer.grads))
        self.dirty = True
        acks = []
        for _, held in self.round.take():
            self.dedup.add(held.sender, held.seq, held.window_start)
            acks.append((held.peer, {"version": self.trainer.version, "applied": True, "duplicate": False,
                                     "staleness": 0}))
        return acks, new

    # -- checkpoints ----------------------------------------------------------
    def due(self, now: float) -> bool:
        return self.dirty and self.path is not None and now >= self.next_checkpoint

    def save(self, layout: Layout) -> None:
        """Write the checkpoint (atomically) if anything was applied since the last one."""
        if not self.dirty or self.path is None:
            return
        state = self.trainer.state()
        if not all(finite(a) for a in [*state["params"].values(), *state["optimizer"].values()]):
            # never reached (a step that makes them non-finite is undone), and never written if it were
            log.error("paramserver shard %d: its weights or optimizer state are not finite: %s not written",
                      self.shard, self.path)
            return
        meta = {"experiment": self.experiment, "version": state["version"], "steps": state["steps"],
                "num_shards": layout.num_shards,
                "tensors": layout.to_wire(), "dedup": self.dedup.state(),
                "dedup_watermark": self.dedup.watermark}
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
            if meta.get("experiment", "") != self.experiment:
                log.warning("paramserver shard %d: %s is a checkpoint of experiment %r, not %r: not restored"
                            " (it is overwritten once this one applies gradients)", self.shard, self.path,
                            meta.get("experiment"), self.experiment)
                return None
            if meta["num_shards"] != num_shards:
                raise ValueError(f"it was written for {meta['num_shards']} shards; paramserver.shards is {num_shards}")
            layout = Layout.from_wire(meta["tensors"], num_shards)
            params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
            opt = {k[len("opt/"):]: v for k, v in arrays.items() if k.startswith("opt/")}
            problem = layout.check_shard(self.shard, params)
            if problem:
                raise ValueError(problem)
            if not all(finite(a) for a in [*params.values(), *opt.values()]):
                log.warning("paramserver shard %d: %s holds non-finite weights or optimizer state: not restored"
                            " (the workers publish their weights again)", self.shard, self.path)
                return None
            self.trainer.load(int(meta["version"]), int(meta["steps"]), params, opt)
            self.dedup.restore(meta["dedup"], int(meta.get("dedup_watermark", -1)))
        except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"paramserver checkpoint {self.path} cannot be read: {exc}") from None
        assert self.trainer.flat is not None
        out = self.trainer.flat.views(self.trainer.params.copy())
        return layout, self.trainer.version, out
