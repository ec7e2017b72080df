"""An actor's links to the paramserver: registry (hello, heartbeat, goodbye) and weights."""

from __future__ import annotations

import logging
import time

from rlfleet.common.clients.registry import RegistryClient, Welcome
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.config import Experiment
from rlfleet.common.runtime import StartupError
from rlfleet.common.security import client_curve, refused_hint
from rlfleet.common.wire.errors import CommTimeout, RemoteError

log = logging.getLogger("rlfleet.actor")

PROBE_S = 0.2  # heartbeat timeout while the paramserver does not answer


class FleetLinks:
    """Registers with paramserver shard 0 and reads weights from every shard."""

    def __init__(self, cfg: Experiment, actor_id: str, role: str) -> None:
        self.cfg = cfg
        self.role = role
        curve = client_curve(cfg, role)  # the role names the key pair (security.client_key)
        self.registry = RegistryClient(cfg.network.paramserver[0], actor_id, role, curve=curve)
        # The reader's sender is the actor id: that is how the barrier sees this actor waiting.
        self.reader = WeightsReader(cfg.network.paramserver, actor_id, timeout_s=cfg.network.timeout_s, curve=curve)
        self.welcome = self._hello(cfg.network.timeout_s)
        self._failing = False
        self.reconnects = 0  # outages of shard 0 that ended (it restarted, or the network came back)

    def _hello(self, timeout_s: float) -> Welcome:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.registry.hello(timeout_s=min(2.0, timeout_s))
            except CommTimeout:
                if time.monotonic() > deadline:
                    self.close()
                    raise StartupError(
                        f"paramserver at {self.cfg.network.paramserver[0]} did not answer within "
                        f"{timeout_s:g} s (network.paramserver, network.timeout_s){refused_hint(self.cfg, self.role)}"
                    ) from None

    @property
    def failing(self) -> bool:
        """The last heartbeat got no answer: the paramserver is away (or cut off)."""
        return self._failing

    def heartbeat(self, version: int, env_steps: int | None = None) -> Welcome | None:
        """Heartbeat shard 0; None (logged once per outage) while it does not answer."""
        # While shard 0 is away the heartbeat is only a probe, and it blocks the actor: keep it short.
        timeout_s = min(PROBE_S, self.cfg.actor.heartbeat_s) if self._failing else self.cfg.actor.heartbeat_s
        try:
            welcome = self.registry.heartbeat(version, timeout_s=timeout_s, env_steps=env_steps)
        except (CommTimeout, RemoteError) as exc:
            if not self._failing:
                log.warning("%s: registry heartbeat failed (%s); acting on", self.registry.actor_id, exc)
            self._failing = True
            return None
        if self._failing:
            log.info("%s: registry answers again", self.registry.actor_id)
            self.reconnects += 1
        self._failing = False
        return welcome

    def close(self) -> None:
        try:
            self.registry.goodbye(timeout_s=1.0)
        except (CommTimeout, RemoteError):
            pass  # the registry expires us after the liveness timeout anyway
        self.registry.close()
        self.reader.close()
