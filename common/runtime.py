"""Running one service: logging, signals, the metrics endpoint, a clean stop.

Every service module (``services/<name>/main.py``, named by its role in
common/roles.py) exposes ``build(cfg, args) -> Service``. :func:`run_service`
runs one in the foreground (``rlfleet service NAME``, what containers run);
the local launcher runs several in threads for ``--inproc``.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlfleet.common.config import ConfigError, Experiment
from rlfleet.common.memory import keep_freed_memory
from rlfleet.common.metrics import MetricsServer, ServiceMetrics
from rlfleet.common.wire.errors import RemoteError

log = logging.getLogger("rlfleet")


class FatalError(RuntimeError):
    """A service cannot go on (a peer refuses what it sends, ...); the message says why."""


class StartupError(FatalError):
    """A service cannot start (peer unreachable, env unusable, ...); the message says why."""


@contextmanager
def refusal_is_fatal(what: str) -> Iterator[None]:
    """A peer's refusal inside (a ``RemoteError``: replay refusing an insert's schema, ...) cannot be
    helped by retrying: the service stops with ``what`` and the peer's reason."""
    try:
        yield
    except RemoteError as exc:
        raise FatalError(f"{what}: {exc}") from None


@dataclass
class ServiceArgs:
    """What distinguishes one instance of a service from another."""

    name: str
    shard: int = 0
    actor_id: str | None = None  # actors: stable id (default: hostname-pid)


class Service(Protocol):
    metrics: ServiceMetrics

    def run(self) -> None: ...

    def stop(self) -> None: ...

    def health(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


Builder = Callable[[Experiment, ServiceArgs], Service]
"""A service module's ``build``."""


class IdleService:
    """A service this experiment does not need (a learner when gradient workers train, a planner when
    planning is off): says why once, then idles until stopped. Compose and the Swarm stack start every
    service whatever the experiment, and restart one that exits; ``rlfleet up`` starts none."""

    def __init__(self, role: str, why: str) -> None:
        self.metrics = ServiceMetrics(role, 0)
        self._stop = threading.Event()
        self.why = why
        log.info("%s: %s; idle until stopped", role, why)

    def run(self) -> None:
        self._stop.wait()

    def stop(self) -> None:
        self._stop.set()

    def health(self) -> dict[str, Any]:
        return {"ok": True, "idle": self.why}

    def close(self) -> None:
        pass


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str = "INFO", file: str | Path | None = None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if file is not None:
        Path(file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(file))
    logging.basicConfig(level=level, format=LOG_FORMAT, handlers=handlers, force=True)


def run_service(cfg: Experiment, args: ServiceArgs, build: Builder) -> int:
    """Run the service ``build`` makes in the foreground until SIGTERM/SIGINT; 0 on a clean stop."""
    from rlfleet.common.envs import EnvError
    from rlfleet.common.launcher_watch import watch_launcher

    keep_freed_memory()  # before any buffer: payloads and messages reuse the heap (common/memory.py)
    try:
        service = build(cfg, args)
    except (StartupError, EnvError, ConfigError) as exc:  # ConfigError: e.g. a missing CurveZMQ key
        log.error("%s cannot start: %s", args.name, exc)
        return 1
    try:
        http = MetricsServer(service.metrics, service.health, cfg.metrics.host, cfg.metrics.port).start()
    except OSError as exc:
        log.error("%s cannot start: metrics.host=%r metrics.port=%d: cannot bind (%s); allowed: an address "
                  "of this host ('0.0.0.0' = all, '127.0.0.1' = local only) and a free port", args.name,
                  cfg.metrics.host, cfg.metrics.port, exc.strerror or exc)
        service.close()
        return 1
    log.info("%s shard %d serving metrics on %s:%d", args.name, args.shard, http.host, http.port)

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("%s: %s received, stopping", args.name, signal.Signals(signum).name)
        service.stop()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    # started by a local launcher: stop as on SIGTERM if it dies without stopping us (common/launcher_watch.py)
    watch = watch_launcher(service.stop)
    code = 0
    try:
        service.run()
    except FatalError as exc:
        log.error("%s cannot go on: %s", args.name, exc)
        code = 1
    finally:
        if watch is not None:
            watch.stop()
        service.close()
        http.close()
    log.info("%s shard %d stopped", args.name, args.shard)
    return code
