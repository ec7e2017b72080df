"""Which versions do the paramserver shards hold? Asked with the cheap ``info`` request, never the weights.

:meth:`VersionProbe.newest` asks every shard at once and waits (the learner at
start-up, and when a shard refuses a publish as ``stale_version``): it costs
one small ``info_reply`` per shard, not a copy of the weights.

:meth:`VersionProbe.step` never blocks: the learner calls it once per loop
iteration. Every ``every_s`` it sends ``info`` to each shard; later steps
collect the replies (``info_reply.stats.versions``). Once every shard
answered, ``step`` returns ("answered", newest version per shard (-1 for
none), the caller's version when it asked); when one has not answered within
``timeout_s``, ("silent", [], ...); otherwise ("waiting", [], ...). A restarted
shard answers with no versions: that is how the learner knows to publish its
weights there again.

The probe uses the connections it is given (the publisher's, for the learner):
a reply it awaits is kept for it even when a publish on the same connection
reads it first (:meth:`~rlfleet.common.wire.connection.Connection.expect`).
"""

from __future__ import annotations

import time
from typing import Literal

from rlfleet.common.clients.paramserver_shards import ParamserverShards, raise_errors
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.errors import CommTimeout

Outcome = Literal["answered", "silent", "waiting"]


def _newest(reply: Message) -> int | None:
    """The newest version an ``info_reply`` says its shard holds (-1: none); None for another reply."""
    if reply.type != "info_reply" or not isinstance(reply["stats"], dict):
        return None
    versions = reply["stats"].get("versions")
    if not isinstance(versions, list) or not all(type(v) is int for v in versions):
        return None
    return max(versions or [-1])


class VersionProbe:
    def __init__(self, shards: ParamserverShards, *, every_s: float = 1.0, timeout_s: float = 5.0) -> None:
        self.shards = shards
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.in_flight: dict[int, int] = {}  # shard -> seq of its info request
        self.answers: dict[int, int] = {}  # shard -> newest version it holds
        self.sent_at = 0.0
        self.asking = False
        self.mine = -1

    def newest(self, timeout_s: float) -> list[int]:
        """The newest version each shard holds (-1: none), waiting up to ``timeout_s``.

        Raises CommTimeout when a shard does not answer, RemoteError when one refuses.
        """
        deadline = time.monotonic() + timeout_s
        n = len(self.shards)
        replies = self.shards.gather({i: Message("info", {}) for i in range(n)}, deadline)
        out = []
        for i in range(n):
            newest = _newest(replies[i])
            if newest is None:
                raise_errors({i: replies[i]}, "info")
                raise CommTimeout(f"paramserver shard {i} answered info with {replies[i].type}")
            out.append(newest)
        return out

    def step(self, mine: int = -1) -> tuple[Outcome, list[int], int]:
        """One non-blocking step; ``mine`` (the caller's version now) comes back with the answers it
        was asked with, so the caller compares them with what it had published when it asked."""
        now = time.monotonic()
        conns = self.shards.connections
        if not self.asking:
            if now - self.sent_at < self.every_s:
                return "waiting", [], self.mine
            self.answers.clear()
            self._forget()
            self.sent_at, self.asking, self.mine = now, True, mine
            for i, c in enumerate(conns):
                seq = c.try_send(Message("info", {}))  # never wait: a shard away long has a full send queue
                if seq is not None:
                    c.expect(seq)
                    self.in_flight[i] = seq
        for i, seq in list(self.in_flight.items()):
            reply = conns[i].reply_to(seq)
            newest = None if reply is None else _newest(reply)
            if newest is not None:
                self.answers[i] = newest
                del self.in_flight[i]
        if len(self.answers) == len(conns):
            self.asking = False
            return "answered", [self.answers[i] for i in range(len(conns))], self.mine
        if now - self.sent_at >= self.timeout_s:
            self.asking = False  # late replies are told apart by their ref_seq
            self._forget()
            return "silent", [], self.mine
        return "waiting", [], self.mine

    def _forget(self) -> None:
        for i, seq in self.in_flight.items():
            self.shards.connections[i].forget(seq)
        self.in_flight.clear()
