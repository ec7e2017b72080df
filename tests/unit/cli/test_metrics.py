"""/metrics and /healthz over real HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from rlfleet.common.metrics import MetricsServer, ServiceMetrics


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_and_health_endpoints() -> None:
    metrics = ServiceMetrics("replay", shard=1)
    steps = metrics.counter("env_steps", "Env steps.")
    by_type = metrics.counter("things", "Things by kind.", ("kind",))
    state = {"ok": True}
    server = MetricsServer(metrics, lambda: dict(state), "127.0.0.1", 0).start()
    try:
        steps.inc(5)
        by_type.labels("a").inc()
        code, text = fetch(f"http://127.0.0.1:{server.port}/metrics")
        assert code == 200
        assert 'rlfleet_env_steps_total{service="replay",shard="1"} 5.0' in text
        assert 'rlfleet_things_total{kind="a",service="replay",shard="1"} 1.0' in text
        assert "_created" not in text
        assert all(line.startswith(("#", "rlfleet_")) for line in text.splitlines() if line)
        code, body = fetch(f"http://127.0.0.1:{server.port}/healthz")
        assert code == 200 and json.loads(body) == {"service": "replay", "ok": True}
        state["ok"] = False
        assert fetch(f"http://127.0.0.1:{server.port}/healthz")[0] == 503
        assert fetch(f"http://127.0.0.1:{server.port}/nope")[0] == 404
    finally:
        server.close()


def test_two_services_in_one_process_keep_separate_registries() -> None:
    a, b = ServiceMetrics("actor", 0), ServiceMetrics("actor", 1)
    a.counter("env_steps", "x").inc(3)
    b.counter("env_steps", "x").inc(4)
    assert b'shard="0"} 3.0' in a.exposition() and b'shard="1"' not in a.exposition()
    assert b'shard="1"} 4.0' in b.exposition()
