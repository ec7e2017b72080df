"""Data-parallel learning: gradients averaged over a torch.distributed group between compute and apply.

Each rank computes gradients on its own share of the global batch (``compute_gradients``); a
:class:`GradientAverager` handed to the learner (``averager``) averages them over the group with
one all-reduce per update (every optimizer's gradients flattened into one buffer: one collective,
not one per tensor, as DistributedDataParallel buckets), and every rank applies the same average
(``apply_gradients``). Ranks that start from the same weights therefore stay identical, and N
ranks with B/N items each take the step one rank would take on all B: the losses are means, so
the mean of the N per-rank gradients is the gradient of the mean over B.

The learner base (common/algorithms/learning.py) is handed the averager and uses it for every
algorithm: gradients pass through :meth:`GradientAverager.average` between compute and apply;
counts that stand for the global batch (PPO's env steps for its annealing) are multiplied by
the group's size; statistics over data that must agree across ranks (PPO's observation
normalisation) are summed with :meth:`GradientAverager.sum`.

A gradient that is None (a parameter the loss does not reach) must be None on every rank:
the same algorithm and config make the same graph, so it is. gloo on CPU, NCCL on CUDA: the
buffer lives on the gradients' device; :attr:`GradientAverager.seconds` runs until the reduction
completed (on CUDA the device is synchronised), not until it was queued. CPU tensors (the update
counter and state of :func:`broadcast_learner`) go through gloo in a CUDA learner's group too
(services/learner/ranks.py: ``cpu:gloo,cuda:nccl``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rlfleet.common.algorithms.contract import Grads


class CollectiveError(Exception):
    """A collective failed: another rank died, or did not answer within the group's timeout.

    Not a RuntimeError, so no code that skips a bad batch takes it for one."""


def _collective(call: Any, *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except RuntimeError as exc:  # gloo's text: "[file.cc:537] Read error [addr]: reset by peer. This is ..."
        text = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).splitlines()[0]).split(". This is")[0]
        raise CollectiveError(text[:300]) from None


class GradientAverager:
    """Averages a learner's gradients over a process group (the default group unless ``group``)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.seconds = 0.0  # spent in all-reduce (a metric: learner_allreduce_seconds)
        self.calls = 0
        self.bytes = 0  # per call, of the last call
        self._buf: torch.Tensor | None = None  # kept: a fresh 100s-of-KB buffer per call costs page faults

    def average(self, grads: Grads) -> Grads:
        """The mean of ``grads`` over the group's ranks, in the same structure (None stays None)."""
        if self.world == 1:
            return grads
        names = sorted(grads)
        present = [g for name in names for g in grads[name] if g is not None]
        if not present:
            return grads
        numel = sum(g.numel() for g in present)
        buf = self._buf
        if buf is None or buf.numel() != numel or buf.dtype != present[0].dtype or buf.device != present[0].device:
            buf = self._buf = torch.empty(numel, dtype=present[0].dtype, device=present[0].device)
        torch.cat([g.reshape(-1) for g in present], out=buf)
        t0 = time.perf_counter()
        _collective(dist.all_reduce, buf, op=dist.ReduceOp.SUM, group=self.group)
        if buf.is_cuda:  # NCCL returns once the reduction is queued: the time is until it completed
            torch.cuda.synchronize(buf.device)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.bytes = buf.numel() * buf.element_size()
        buf.div_(self.world)
        out: Grads = {}
        offset = 0
        for name in names:
            averaged: list[torch.Tensor | None] = []
            for g in grads[name]:
                if g is None:
                    averaged.append(None)
                    continue
                averaged.append(buf[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            out[name] = averaged
        return out

    def sum(self, tensors: Sequence[torch.Tensor]) -> None:
        """Sum each of ``tensors`` over the group, in place (one collective for all)."""
        if self.world == 1 or not tensors:
            return
        buf = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors])
        _collective(dist.all_reduce, buf, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for t in tensors:
            t.copy_(buf[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def broadcast(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Every rank's ``tensors`` become rank ``src``'s (start from one set of weights)."""
        if self.world == 1:
            return
        for t in tensors:
            _collective(dist.broadcast, t.data, src=src, group=self.group)


def broadcast_learner(core: Any, averager: GradientAverager, src: int | None = None) -> int:
    """Every rank's learner takes the state (networks, optimizers, counters, statistics) of rank
    ``src``; None: of the rank that has trained furthest (it resumed from the newest checkpoint;
    ties: the lowest rank), so ranks that restarted on hosts without that checkpoint start from it
    too. Tensors on the wire, no pickling. Returns the rank it came from."""
    if averager.world == 1:
        return averager.rank
    if src is None:
        updates = torch.zeros(averager.world, dtype=torch.float64)
        updates[averager.rank] = core.num_updates
        averager.sum([updates])
        src = int(torch.argmax(updates))  # the first of the maxima
    for optimizer in core.optimizers.values():  # moments as after a first step: every rank's state has the same tensors
        optimizer.ensure_state()
    core.load_state(_broadcast_tree(core.state(), averager, src))
    return src


def _broadcast_tree(tree: Any, averager: GradientAverager, src: int) -> Any:
    """``tree`` (dicts, lists, tensors, arrays, numbers) with every leaf replaced by rank ``src``'s."""
    if isinstance(tree, torch.Tensor):
        averager.broadcast([tree], src)
        return tree
    if isinstance(tree, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(tree)).clone()
        averager.broadcast([t], src)
        return t.numpy()
    if isinstance(tree, float):
        t = torch.tensor(tree, dtype=torch.float64)
        averager.broadcast([t], src)
        return float(t.item())
    if isinstance(tree, int):  # bools too; and 128-bit ints (a numpy generator's state): as 32 bytes
        t = torch.frombuffer(bytearray(int(tree).to_bytes(32, "little", signed=True)), dtype=torch.uint8)
        averager.broadcast([t], src)
        return type(tree)(int.from_bytes(t.numpy().tobytes(), "little", signed=True))
    if isinstance(tree, dict):
        done = {key: _broadcast_tree(tree[key], averager, src) for key in sorted(tree, key=str)}
        return {key: done[key] for key in tree}
    if isinstance(tree, list | tuple):
        return type(tree)(_broadcast_tree(item, averager, src) for item in tree)
    return tree  # strings, None: the same config gives the same
