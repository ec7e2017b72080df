"""The gradient workers' paramserver client: one push of gradients, each shard its slice.

A push carries the version the gradients were computed on; each shard applies
its slice with its own optimizer (services/paramserver/gradients.py) or refuses
it whole. Requests still awaited when a shard restarts are sent again with the
same seq (common/clients/paramserver_shards.py), which the shard recognises as a
duplicate if it had applied it. ``sender`` must be this worker's own for its
lifetime: shards apply a push once per (sender, seq).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from rlfleet.common.clients.paramserver_shards import ParamserverShards, raise_errors
from rlfleet.common.tensor_shards import Layout
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.dedup import first_seq_of
from rlfleet.common.wire.transport import CurveConfig

#: reasons a shard refuses a push that say "try again with newer weights", not "this push is wrong"
RETRYABLE = frozenset({"stale_gradients", "unknown_version", "no_weights", "not_registered", "busy"})
#: a shard's slice up to this size is sent as one packed frame, larger ones a frame per tensor
PACK_MAX_BYTES = 256 << 10


@dataclass
class PushOutcome:
    """What the shards did with one push."""

    applied: int = 0  # shards that applied it now
    duplicates: int = 0  # shards that had applied it before (a resend)
    refused: dict[int, tuple[str, str]] = field(default_factory=dict)  # shard -> (reason, detail)
    version: int = -1  # the newest version any shard answered with
    staleness: int = 0  # largest staleness a shard applied it with

    @property
    def complete(self) -> bool:
        return not self.refused


class GradientPusher:
    def __init__(self, addresses: Sequence[str], sender: str, *, curve: CurveConfig | None = None,
                 ctx: zmq.Context[Any] | None = None, timeout_s: float = 10.0) -> None:
        # push seqs start where each shard says (info_reply's first_seq, asked before the first push;
        # common/wire/dedup.py): above every seq of a sender it forgot, so no push is taken for an old resend
        self.shards = ParamserverShards(addresses, sender, curve, ctx)
        self._seqs_known = False
        self.timeout_s = timeout_s
        self._layout: Layout | None = None
        self._names: set[str] = set()
        self._packed: dict[int, bool] = {}
        self._unanswered: dict[int, int] | None = None  # seqs of the last push, while it is not answered

    def layout_for(self, grads: Mapping[str, np.ndarray]) -> Layout:
        layout = self._layout
        if layout is None or self._names != grads.keys():
            layout = self._layout = Layout.of(grads, len(self.shards))
            self._names = set(grads)
            # a small slice goes as one packed frame (a frame per tensor costs more than the copy)
            self._packed = {i: layout.shard_nbytes(i) <= PACK_MAX_BYTES for i in range(len(self.shards))}
        return layout

    def push(self, version: int, grads: Mapping[str, np.ndarray], *, barrier: bool = False,
             timeout_s: float | None = None, again: bool = False) -> PushOutcome:
        """Send every shard its slice of ``grads`` (float32, named like the weights); CommTimeout if a
        shard does not answer within the timeout (the pusher's, or ``timeout_s``).

        ``barrier``: part of a synchronous round, answered once every live worker pushed. ``again``: the
        same push as the last call that timed out, sent again with its seqs (the shard holds it once)."""
        layout = self.layout_for(grads)
        if not self._seqs_known:
            self._start_seqs(time.monotonic() + (timeout_s or self.timeout_s))
        body: dict[str, Any] = {"version": version, "num_shards": layout.num_shards, "layout": layout.fingerprint}
        if barrier:
            body["barrier"] = True
        # one push in flight: every earlier one is answered (or given up), so its own seq starts the window
        seqs = self._unanswered if again and self._unanswered else {
            i: c.next_seq() for i, c in enumerate(self.shards.connections)}
        self._unanswered = seqs
        requests = {i: Message("push_gradients", {**body, "window_start": seqs[i]}, layout.slice(grads, i))
                    for i in range(len(self.shards))}
        replies = self.shards.gather(requests, time.monotonic() + (timeout_s or self.timeout_s), seqs, self._packed)
        self._unanswered = None
        out = PushOutcome()
        for i, r in sorted(replies.items()):
            if r.type == "error":
                out.refused[i] = (r["reason"], r["detail"])
                continue
            out.version = max(out.version, r["version"])
            if r["duplicate"]:
                out.duplicates += 1
            else:
                out.applied += 1
                out.staleness = max(out.staleness, r["staleness"])
        return out

    def _start_seqs(self, deadline: float) -> None:
        """Each shard's connection numbers its requests from the first_seq that shard answers info with."""
        replies = self.shards.gather({i: Message("info", {}) for i in range(len(self.shards))}, deadline)
        raise_errors(replies, "info")
        for i, reply in replies.items():
            self.shards.connections[i].seqs_from(first_seq_of(reply, f"paramserver shard {i}"))
        self._seqs_known = True

    def close(self) -> None:
        self.shards.close()
