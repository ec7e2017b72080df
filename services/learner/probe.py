"""Which versions do the paramserver shards hold? Asked without ever blocking the learner.

The learner calls :meth:`VersionProbe.step` once per loop iteration. Every
``every_s`` it sends ``info`` to each shard; later steps collect the replies
(``info_reply.stats.versions``). Once every shard answered, ``step`` returns
("answered", newest version per shard (-1 for none), the caller's version when
it asked); when one has not answered within ``timeout_s``, ("silent", [], ...);
otherwise ("waiting", [], ...). A restarted shard answers with no versions: that is how the
learner knows to publish its weights there again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

import zmq

from common.protocol import Message, ProtocolError, encode
from common.server import Client, CommTimeout
from common.transport import CurveConfig

Outcome = Literal["answered", "silent", "waiting"]


class VersionProbe:
    def __init__(self, addresses: Sequence[str], sender: str, *, every_s: float = 1.0, timeout_s: float = 5.0,
                 curve: CurveConfig | None = None) -> None:
        self.clients = [Client(a, sender, curve=curve) for a in addresses]
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.in_flight: dict[int, int] = {}  # shard -> seq of its info request
        self.answers: dict[int, int] = {}  # shard -> newest version it holds
        self.sent_at = 0.0
        self.asking = False
        self.mine = -1

    def step(self, mine: int = -1) -> tuple[Outcome, list[int], int]:
        """One non-blocking step; ``mine`` (the caller's version now) comes back with the answers it
        was asked with, so the caller compares them with what it had published when it asked."""
        now = time.monotonic()
        if not self.asking:
            if now - self.sent_at < self.every_s:
                return "waiting", [], self.mine
            self.answers.clear()
            self.in_flight.clear()
            self.sent_at, self.asking, self.mine = now, True, mine
            for i, c in enumerate(self.clients):
                msg = Message("info", {}, sender=c.sender, seq=c.next_seq())
                try:  # never wait here: a shard away long enough has a full send queue
                    c.sock.send_multipart(encode(msg), copy=False, flags=zmq.NOBLOCK)
                    self.in_flight[i] = msg.seq
                except zmq.Again:
                    pass
        for i, seq in list(self.in_flight.items()):
            newest = self._drain(i, seq)
            if newest is not None:
                self.answers[i] = newest
                del self.in_flight[i]
        if len(self.answers) == len(self.clients):
            self.asking = False
            return "answered", [self.answers[i] for i in range(len(self.clients))], self.mine
        if now - self.sent_at >= self.timeout_s:
            self.asking = False  # late replies are told apart by their ref_seq
            return "silent", [], self.mine
        return "waiting", [], self.mine

    def _drain(self, i: int, seq: int) -> int | None:
        sock = self.clients[i].sock
        while sock.poll(0, zmq.POLLIN):
            try:
                reply = self.clients[i].recv(0)
            except (CommTimeout, ProtocolError):
                return None
            if reply.get("ref_seq") == seq and reply.type == "info_reply":
                return max(reply["stats"].get("versions") or [-1])
        return None

    def close(self) -> None:
        for c in self.clients:
            c.close()
