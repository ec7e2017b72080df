"""Fakes shared by the tests of the paramserver shard's parts (no tests of its own).

A part that answers requests is handed the request loop as a replier; these tests hand it a
:class:`RecordingReplier` instead and read what it would have sent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.tensor_shards import Layout
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.server import Peer
from rlfleet.services.paramserver.metrics import ShardMetrics

SHAPES = {"w": (3, 2), "b": (2,)}


class RecordingReplier:
    """Keeps each reply as (peer identity, message type, body, copy) instead of sending it."""

    def __init__(self) -> None:
        self.name = "paramserver-test"
        self.sent: list[tuple[bytes, str, dict[str, Any], bool]] = []
        self.counted_errors: list[str] = []

    def reply(self, peer: Peer, msg: Message, *, copy: bool = True) -> bool:
        self.sent.append((peer.identity, msg.type, msg.body, copy))
        return True

    def reply_error(self, peer: Peer, reason: str, detail: str, *, count: bool = True) -> None:
        if count:
            self.counted_errors.append(reason)
        self.reply(peer, Message("error", {"reason": reason, "detail": detail}))

    def types(self) -> list[tuple[bytes, str]]:
        return [(identity, mtype) for identity, mtype, _, _ in self.sent]


def metrics() -> ShardMetrics:
    return ShardMetrics(ServiceMetrics("paramserver"))


def peer(name: str, seq: int = 1) -> Peer:
    return Peer(name.encode(), seq, name)


def weights(value: float) -> dict[str, np.ndarray]:
    return {n: np.full(s, value, np.float32) for n, s in SHAPES.items()}


def publish(version: int, value: float | None = None, model: str | None = None) -> Message:
    """A one-shard ``publish`` of version ``version`` (every value ``value``, by default the version)."""
    arrays = weights(version if value is None else value)
    layout = Layout.of(arrays, 1)
    body: dict[str, Any] = {"version": version, "num_shards": 1, "layout": layout.fingerprint,
                            "tensors": layout.to_wire()}
    if model is not None:
        body["model"] = model
    return Message("publish", body, arrays, sender="learner")


def request(mtype: str, sender: str, **body: Any) -> Message:
    return Message(mtype, body, sender=sender)
