"""What the parts of the replay server need of its request loop: sending replies, counting traffic.

:class:`rlfleet.common.wire.server.Server` is the one implementation; the parts take this
narrower type so that a test can hand them a fake loop that records the replies.
"""

from __future__ import annotations

import itertools
from typing import Any, Protocol

from rlfleet.common.wire.codec import Limits, Message
from rlfleet.common.wire.server import Peer


class Replier(Protocol):
    name: str  # the sender id of the replies
    seq: itertools.count[int]  # the seq of the next reply
    limits: Limits
    bind_senders: bool  # True under CurveZMQ: a sender id carries its key's fingerprint

    def reply(self, peer: Peer, msg: Message, *, copy: bool = True) -> bool: ...

    def reply_frames(self, peer: Peer, msg: Message) -> list[Any]: ...

    def send_frames(self, peer: Peer, frames: list[Any], mtype: str, *, copy: bool = True) -> bool: ...

    def reply_error(self, peer: Peer, reason: str, detail: str, *, count: bool = True) -> None: ...

    def count(self, mtype: str, direction: str, nbytes: int) -> None: ...

    def owner_suffix(self, frames: list[Any]) -> str: ...
