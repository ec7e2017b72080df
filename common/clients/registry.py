"""An actor's registration with paramserver shard 0: hello, heartbeat, goodbye."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import zmq

from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.errors import RemoteError
from rlfleet.common.wire.transport import CurveConfig


@dataclass(frozen=True)
class Welcome:
    index: int  # 0..N-1 for actors, -1 for evaluators and after goodbye
    num_actors: int  # live actors
    liveness_s: float  # silent this long -> removed
    fleet_env_steps: int = 0  # env steps all actors reported, restarts included


class RegistryClient:
    """An actor's registration with paramserver shard 0."""

    def __init__(
        self,
        address: str,
        actor_id: str,
        role: str = "actor",
        *,
        curve: CurveConfig | None = None,
        ctx: zmq.Context[Any] | None = None,
    ) -> None:
        self.actor_id = actor_id
        self.role = role
        self.connection = Connection(address, actor_id, curve=curve, ctx=ctx)

    def _call(self, msg: Message, timeout_s: float) -> Welcome:
        reply = self.connection.request(msg, timeout_s)
        if reply.type != "welcome":
            raise RemoteError("unexpected_reply", f"expected welcome, got {reply.type}")
        return Welcome(reply["index"], reply["num_actors"], reply["liveness_ms"] / 1000,
                       reply.get("fleet_env_steps") or 0)

    def hello(self, timeout_s: float = 5.0) -> Welcome:
        return self._call(Message("hello", {"actor_id": self.actor_id, "role": self.role}), timeout_s)

    def heartbeat(self, version: int = -1, timeout_s: float = 5.0, env_steps: int | None = None) -> Welcome:
        body: dict[str, Any] = {"actor_id": self.actor_id, "role": self.role, "version": version}
        if env_steps is not None:
            body["env_steps"] = env_steps
        return self._call(Message("heartbeat", body), timeout_s)

    def goodbye(self, timeout_s: float = 5.0) -> Welcome:
        return self._call(Message("goodbye", {"actor_id": self.actor_id}), timeout_s)

    def close(self) -> None:
        self.connection.close()
