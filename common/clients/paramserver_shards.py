"""One connection per paramserver shard: scatter requests, gather the replies matched by seq.

Shared by every paramserver client: :class:`~rlfleet.common.clients.weights_publisher.WeightsPublisher`
(the learner's publishes, barriers and version probes on the same connections),
:class:`~rlfleet.common.clients.weights_reader.WeightsReader` (actors, evaluators) and
:class:`~rlfleet.common.clients.version_probe.VersionProbe`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import zmq

from rlfleet.common.wire.codec import DEFAULT_LIMITS, Limits, Message
from rlfleet.common.wire.connection import Connection, collect
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.common.wire.schema import DEFAULT_MODEL, model_name_problem
from rlfleet.common.wire.transport import CurveConfig

#: extra time a client waits beyond a long poll's own timeout before giving up on the server
WAIT_MARGIN_S = 1.0


class ParamserverShards:
    """A :class:`~rlfleet.common.wire.connection.Connection` to each shard, in shard order."""

    def __init__(self, addresses: Sequence[str], sender: str, curve: CurveConfig | None = None,
                 ctx: zmq.Context[Any] | None = None, limits: Limits = DEFAULT_LIMITS, seq_start: int = 1) -> None:
        if not addresses:
            raise ValueError("the paramserver needs at least one shard address")
        self.addresses = list(addresses)
        # handshakes watched: a shard that restarts while a reply is awaited lost the request with its
        # old connection, and gets it again at once instead of at the caller's timeout
        self.connections = [Connection(a, sender, curve=curve, ctx=ctx, limits=limits, watch_handshakes=True,
                                       seq_start=seq_start) for a in addresses]

    def __len__(self) -> int:
        return len(self.connections)

    def send(self, i: int, msg: Message, seq: int | None = None, packed: bool = False) -> int:
        """Send ``msg`` to shard ``i`` (with ``seq``, or the connection's next; ``packed``: its arrays in
        one frame); the seq its reply will reference."""
        self.connections[i].reconnected()  # reconnections before this request are no reason to send it twice
        return self.connections[i].send(msg, seq, packed=packed)

    def gather(self, requests: Mapping[int, Message], deadline: float,
               seqs: Mapping[int, int] | None = None, packed: Mapping[int, bool] | None = None) -> dict[int, Message]:
        """Send every request (with ``seqs``, and packed where ``packed`` says, if given), then collect one
        reply per shard (``error`` replies included)."""
        seqs = {i: self.send(i, msg, None if seqs is None else seqs[i], bool(packed and packed[i]))
                for i, msg in requests.items()}
        return self.collect(seqs, requests, deadline)

    def collect(self, seqs: Mapping[int, int], requests: Mapping[int, Message], deadline: float) -> dict[int, Message]:
        """One reply per shard to the requests already sent with these seqs; CommTimeout at ``deadline``."""
        out = collect({i: (self.connections[i], seq) for i, seq in seqs.items()}, deadline,
                      resend=lambda i: self._resend(i, requests[i], seqs[i]))
        pending = sorted(set(seqs) - set(out))
        if pending:
            raise CommTimeout(
                f"paramserver shard(s) {pending} ({', '.join(self.addresses[i] for i in pending)}) "
                f"did not answer {requests[pending[0]].type} in time"
            )
        return out

    def _resend(self, i: int, msg: Message, seq: int) -> None:
        try:
            self.connections[i].send(msg, seq=seq)
        except CommTimeout:
            pass  # its queue is full: the caller's deadline decides

    def close(self) -> None:
        for c in self.connections:
            c.close()


def raise_errors(replies: Mapping[int, Message], what: str) -> None:
    """Raise RemoteError for the first shard (by index) that answered ``error``."""
    for i, r in sorted(replies.items()):
        if r.type == "error":
            raise RemoteError(r["reason"], f"paramserver shard {i}, {what}: {r['detail']}")


def checked_model(model: str | None) -> str | None:
    """A client's ``model``: None for the default model (its messages carry no ``model``), else the name.

    Raises ValueError naming the bad name and what is allowed (common.wire.schema.MODEL_NAME).
    """
    if model is None or model == DEFAULT_MODEL:
        return None
    problem = model_name_problem(model)
    if problem is not None:
        raise ValueError(problem)
    return model
