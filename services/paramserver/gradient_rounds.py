"""Synchronous gradient rounds (A2C on the barrier protocol) on a paramserver shard.

Round k collects one push per live worker, each computed on version k: the
shard sums them as they arrive and holds their replies; once every live actor of
shard 0's registry (at least one) has pushed, it applies the mean of their
pushes once (version k + 1) and answers every held push. A push counts for the
registered actor its sender names (``<actor id>/<token>``, as workers send):
a sender that names no live actor is refused (``not_registered``), so pushes of
strangers can neither complete a round nor weigh in its mean. A worker that
dies stops counting when the registry expires it (its liveness timeout), so the
round then completes without it (its held push is refused then). A push for any other version than the newest
is stale (the round it belonged to is over) and refused; its worker pulls the
newest version and acts on. A resend of a held push (same sender and seq, after
a reconnect) replaces the held reply instead of counting twice; another push of
a sender already in the round (a restarted worker) replaces its contribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from common.wire.server import Peer


def actor_of(sender: str) -> str:
    """The registry id a push's sender names: ``<actor id>/<token>`` (with CurveZMQ, ``@<key>`` follows)."""
    return sender.split("/", 1)[0]


@dataclass
class RoundPush:
    peer: Peer
    sender: str
    seq: int
    window_start: int | None
    grads: np.ndarray  # this push's flat gradient (the round sums them at the end)


@dataclass
class GradientRound:
    version: int = -1
    pushes: dict[str, RoundPush] = field(default_factory=dict)  # by the registered actor it counts for

    def add(self, version: int, actor: str, held: RoundPush) -> None:
        if version != self.version:
            self.version = version
            self.pushes.clear()
        self.pushes[actor] = held

    def gone(self, live: set[str]) -> list[RoundPush]:
        """Take out the pushes of actors no longer live (they count no more)."""
        return [self.pushes.pop(a) for a in [a for a in self.pushes if a not in live]]

    def ready(self, live: set[str]) -> bool:
        return bool(self.pushes) and live <= set(self.pushes)

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
