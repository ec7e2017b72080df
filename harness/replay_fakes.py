"""Fakes for the replay server's parts: a request loop without a socket."""

from __future__ import annotations

import itertools
from typing import Any

from rlfleet.common.wire.codec import DEFAULT_LIMITS, Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.server import Peer


class RecordingLoop:
    """A request loop without a socket (the parts' Replier): every message sent, decoded, in order.
    The other tests of the replay parts use it too."""

    name = "replay-0"
    limits = DEFAULT_LIMITS
    bind_senders = False

    def __init__(self) -> None:
        self.seq = itertools.count(1)
        self.sent: list[tuple[Peer, Message]] = []

    def reply(self, peer: Peer, msg: Message, *, copy: bool = True) -> bool:
        return self.send_frames(peer, self.reply_frames(peer, msg), msg.type)

    def reply_frames(self, peer: Peer, msg: Message) -> list[Any]:
        msg.body.setdefault("ref_seq", peer.seq)
        msg.sender, msg.seq = self.name, next(self.seq)
        return encode(msg)

    def send_frames(self, peer: Peer, frames: list[Any], mtype: str, *, copy: bool = True) -> bool:
        self.sent.append((peer, decode([bytes(memoryview(f)) for f in frames])))
        return True

    def reply_error(self, peer: Peer, reason: str, detail: str, *, count: bool = True) -> None:
        self.reply(peer, Message("error", {"ref_seq": peer.seq, "reason": reason, "detail": detail}))

    def count(self, mtype: str, direction: str, nbytes: int) -> None:
        pass

    def owner_suffix(self, frames: list[Any]) -> str:
        return ""
