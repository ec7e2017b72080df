"""Prometheus metrics and the /metrics + /healthz endpoint of every service.

Each service instance owns a CollectorRegistry, so several services can share
one process (``rlfleet up --inproc``) and still be scraped separately. Every
metric is named ``rlfleet_*`` and carries the labels ``service`` and ``shard``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

# The *_created series double every counter's lines and no dashboard uses them.
disable_created_metrics()

PREFIX = "rlfleet_"
BASE_LABELS = ("service", "shard")


class Labeled:
    """A metric with extra labels beyond service/shard; children are cached."""

    def __init__(self, metric: Any, base: tuple[str, str]) -> None:
        self._metric = metric
        self._base = base
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: Any) -> Any:
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._metric.labels(*self._base, *key)
        return child


class ServiceMetrics:
    """The metrics of one service instance, with the ones every service has."""

    def __init__(self, service: str, shard: int | str = 0) -> None:
        self.service = service
        self.shard = str(shard)
        self.registry = CollectorRegistry(auto_describe=True)
        self.protocol_errors = self.counter(
            "protocol_errors", "Messages rejected by the decoder or a handler, by reason.", ("reason",)
        )
        self.messages = self.counter(
            "messages", "Messages by type and direction (in/out).", ("type", "direction")
        )
        self.bytes = self.counter("bytes", "Bytes by message type and direction (in/out).", ("type", "direction"))
        self.up = self.gauge("up", "1 while the service is serving.")

    def _make(self, cls: type, name: str, doc: str, labels: Sequence[str], **kw: Any) -> Any:
        metric = cls(PREFIX + name, doc, (*BASE_LABELS, *labels), registry=self.registry, **kw)
        base = (self.service, self.shard)
        return Labeled(metric, base) if labels else metric.labels(*base)

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Any:
        return self._make(Counter, name, doc, labels)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Any:
        return self._make(Gauge, name, doc, labels)

    def histogram(
        self, name: str, doc: str, labels: Sequence[str] = (), buckets: Sequence[float] | None = None
    ) -> Any:
        kw = {"buckets": buckets} if buckets else {}
        return self._make(Histogram, name, doc, labels, **kw)

    def count_message(self, mtype: str, direction: str, nbytes: int) -> None:
        self.messages.labels(mtype, direction).inc()
        self.bytes.labels(mtype, direction).inc(nbytes)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


HealthFn = Callable[[], dict[str, Any]]


class MetricsServer:
    """Serves ``/metrics`` (Prometheus text) and ``/healthz`` (JSON) over HTTP.

    ``health()`` returns a dict with at least ``ok``; /healthz answers 200
    when it is true and 503 otherwise. Port 0 picks a free port.
    """

    def __init__(self, metrics: ServiceMetrics, health: HealthFn, host: str = "0.0.0.0", port: int = 0):
        self.metrics = metrics
        self.health = health
        handler = _make_handler(self)
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self.host, self.port = self._httpd.server_address[:2]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name=f"metrics-{metrics.service}", daemon=True
        )

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _make_handler(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, server.metrics.exposition())
            elif path == "/healthz":
                try:
                    status = server.health()
                except Exception as exc:  # a failing probe is an unhealthy service, not a crash
                    status = {"ok": False, "error": repr(exc)}
                body = json.dumps({"service": server.metrics.service, **status}, default=str)
                self._send(200 if status.get("ok") else 503, "application/json", body.encode())
            else:
                self._send(404, "text/plain", b"not found: try /metrics or /healthz\n")

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
            pass

    return Handler
