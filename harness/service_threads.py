"""A config's replay and paramserver services in threads of the test's own process, for tests that drive a
real actor (or client) against them and look inside the servers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rlfleet.common.runtime import ServiceArgs
from rlfleet.services.paramserver.main import build as build_paramserver
from rlfleet.services.replay.main import build as build_replay


@contextmanager
def replay_and_paramserver(cfg: Any) -> Iterator[tuple[Any, Any]]:
    """(replay, paramserver) built from ``cfg`` and serving on its addresses (bound on loopback: the test's
    own host); stopped, joined and closed after."""
    cfg = cfg.model_copy(update={"network": cfg.network.model_copy(update={"bind_host": "127.0.0.1"})})
    replay = build_replay(cfg, ServiceArgs("replay"))
    params = build_paramserver(cfg, ServiceArgs("paramserver"))
    servers = (replay, params)
    threads = [threading.Thread(target=s.run, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        yield replay, params
    finally:
        for s in servers:
            s.stop()
        for t in threads:
            t.join(10)
        for s in servers:
            s.close()
