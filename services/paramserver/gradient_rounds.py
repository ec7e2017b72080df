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
newest version and acts on.

A round holds one slot per full sender (the header's, ``<actor id>/<token>``, with
CurveZMQ's key suffix): a push never replaces or answers for another sender's, so a
client sending as ``<victim id>/<anything>`` cannot displace the victim's held push (it
used to take the victim's slot, and the victim's push was never answered). A resend
of a held push (same sender and seq, after a reconnect) replaces the held reply; a
new seq of the same sender replaces that sender's contribution. The mean weighs every
live actor alike: an actor with several senders in the round (a worker restarted
under a new token while its old push was held, or someone else pushing in its name)
counts the mean of its senders' pushes, so no sender can outweigh an actor's share.
At most :data:`MAX_SENDERS_PER_ACTOR` senders per actor per round (each slot holds a
gradient copy): another is refused ``busy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlfleet.common.wire.server import Peer


def actor_of(sender: str) -> str:
    """The registry id a push's sender names: ``<actor id>/<token>`` (with CurveZMQ, ``@<key>`` follows)."""
    return sender.split("/", 1)[0]


#: senders one actor may have in a round (each holds a copy of the gradients); more are refused ``busy``
MAX_SENDERS_PER_ACTOR = 16


@dataclass
class RoundPush:
    peer: Peer
    sender: str
    seq: int
    window_start: int | None
    grads: np.ndarray  # this push's flat gradient (the round sums them at the end)

    @property
    def actor(self) -> str:
        return actor_of(self.sender)


@dataclass
class GradientRound:
    version: int = -1
    pushes: dict[str, RoundPush] = field(default_factory=dict)  # by full sender: one slot each

    def held(self, version: int, sender: str) -> RoundPush | None:
        """The push ``sender`` holds in round ``version`` (None if none, or the round is another)."""
        return self.pushes.get(sender) if version == self.version else None

    def senders_of(self, version: int, actor: str) -> int:
        """How many senders push for ``actor`` in round ``version``."""
        return sum(p.actor == actor for p in self.pushes.values()) if version == self.version else 0

    def add(self, version: int, held: RoundPush) -> None:
        if version != self.version:
            self.version = version
            self.pushes.clear()
        self.pushes[held.sender] = held

    def gone(self, live: set[str]) -> list[RoundPush]:
        """Take out the pushes of actors no longer live (they count no more)."""
        return [self.pushes.pop(s) for s in [s for s, p in self.pushes.items() if p.actor not in live]]

    def ready(self, live: set[str]) -> bool:
        return bool(self.pushes) and live <= {p.actor for p in self.pushes.values()}

    def mean(self, out: np.ndarray) -> np.ndarray:
        """The mean over actors of each actor's mean push, written into ``out``."""
        by_actor: dict[str, list[np.ndarray]] = {}
        for p in self.pushes.values():
            by_actor.setdefault(p.actor, []).append(p.grads)
        out.fill(0)
        for grads in by_actor.values():
            if len(grads) == 1:
                out += grads[0]
            else:
                out += np.sum(grads, axis=0, dtype=np.float32) / np.float32(len(grads))
        out /= np.float32(len(by_actor))
        return out

    def take(self) -> list[tuple[str, RoundPush]]:
        """The held pushes (to answer), leaving the round empty."""
        out = list(self.pushes.items())
        self.pushes.clear()
        return out
