"""How shard 0 answers ``hello``, ``heartbeat`` and ``goodbye``: the requests of its
:class:`~rlfleet.services.paramserver.registry.Registry` of live actors and evaluators."""

from __future__ import annotations

import logging
from typing import Any

from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.errors import RequestError
from rlfleet.common.wire.server import Peer
from rlfleet.services.paramserver.registry import BadMember, Registry
from rlfleet.services.paramserver.replies import Replier

log = logging.getLogger(__name__)


class RegistryRequests:
    """The registry handlers of shard 0, and the ``live_actors`` gauge they keep up to date."""

    def __init__(self, replier: Replier, registry: Registry, live_actors: Any) -> None:
        self.replier = replier
        self.registry = registry
        self._live_actors = live_actors

    def on_hello(self, peer: Peer, msg: Message) -> None:
        self._welcome(peer, self._join(msg, -1))

    def on_heartbeat(self, peer: Peer, msg: Message) -> None:
        index = self._join(msg, msg["version"])
        steps = msg.get("env_steps")
        if steps is not None and msg["role"] == "actor":
            self.registry.report_steps(msg["actor_id"], steps)
        self._welcome(peer, index)

    def on_goodbye(self, peer: Peer, msg: Message) -> None:
        member = self.registry.leave(msg["actor_id"])
        if member is not None:
            log.info("%s: %s %r (index %d) said goodbye (%d live actors)", self.replier.name, member.role,
                     member.actor_id, member.index, self.registry.num_actors)
        self._welcome(peer, -1)

    def tick(self) -> None:
        """Drop the members silent for longer than the liveness timeout."""
        if self.registry.expire():
            self._live_actors.set(self.registry.num_actors)

    def _join(self, msg: Message, version: int) -> int:
        """Register or refresh the member ``msg`` names; returns its index."""
        actor_id, role = msg["actor_id"], msg["role"]
        try:
            member, new = self.registry.join(actor_id, role, version)
        except BadMember as exc:
            raise RequestError(exc.reason, str(exc)) from None
        if new:
            how = "joined" if msg.type == "hello" else "re-registered by heartbeat"
            log.info("%s: %s %r %s with index %d (%d live actors)", self.replier.name, role, actor_id, how,
                     member.index, self.registry.num_actors)
        return member.index

    def _welcome(self, peer: Peer, index: int) -> None:
        self._live_actors.set(self.registry.num_actors)
        body = {"index": index, "num_actors": self.registry.num_actors,
                "liveness_ms": int(self.registry.liveness_s * 1000),
                "fleet_env_steps": self.registry.fleet_env_steps}
        self.replier.reply(peer, Message("welcome", body))
