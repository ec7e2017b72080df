"""Synchronous gradient rounds (A2C on the barrier protocol) on a paramserver shard.

Round k collects one push per live worker, each computed on version k: the
shard sums them as they arrive and holds their replies; once as many distinct
workers have pushed as shard 0's registry counts live actors (at least one), it
applies the mean once (version k + 1) and answers every held push. A worker that
dies stops counting when the registry expires it (its liveness timeout), so the
round then completes without it. A push for any other version than the newest
is stale (the round it belonged to is over) and refused; its worker pulls the
newest version and acts on. A resend of a held push (same sender and seq, after
a reconnect) replaces the held reply instead of counting twice; another push of
a sender already in the round (a restarted worker) replaces its contribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from common.wire.server import Peer


@dataclass
class RoundPush:
    peer: Peer
    seq: int
    window_start: int | None
    grads: np.ndarray  # this push's flat gradient (the round sums them at the end)


@dataclass
class GradientRound:
    version: int = -1
    pushes: dict[str, RoundPush] = field(default_factory=dict)  # by sender

    def add(self, version: int, sender: str, held: RoundPush) -> None:
        if version != self.version:
            self.version = version
            self.pushes.clear()
        self.pushes[sender] = held

    def ready(self, live_workers: int) -> bool:
        return bool(self.pushes) and len(self.pushes) >= live_workers

    def mean(self, out: np.ndarray) -> np.ndarray:
        """The mean of the held gradients, written into ``out``."""
        held = list(self.pushes.values())
        np.copyto(out, held[0].grads)
        for h in held[1:]:
            out += h.grads
        out /= np.float32(len(held))
        return out

    def take(self) -> list[tuple[str, RoundPush]]:
        """The held pushes (to answer), leaving the round empty."""
        out = list(self.pushes.items())
        self.pushes.clear()
        return out
