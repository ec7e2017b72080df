"""What a shard's request-handling parts need of the request loop: a way to answer.

The shard (a :class:`rlfleet.common.wire.server.Server`) is that replier; a part's tests hand it a fake
that records the replies instead.
"""

from __future__ import annotations

from typing import Protocol

from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.server import Peer


class Replier(Protocol):
    name: str  # the loop's name, for log lines ("paramserver-0")

    def reply(self, peer: Peer, msg: Message, *, copy: bool = True) -> bool: ...

    def reply_error(self, peer: Peer, reason: str, detail: str, *, count: bool = True) -> None: ...
