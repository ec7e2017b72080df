"""The Grafana dashboards and provisioning under deploy/grafana, read as Grafana would, and their
queries asked of a real Prometheus (tests/fleet/test_dashboards.py, tests/containers/test_containers.py)."""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))

#: Grafana's built-in variables, as Grafana would fill them for a 30 min view scraped every 5 s
#: ($__rate_interval is at least 4 scrape intervals; 1m leaves room for a missed scrape).
BUILTINS = {
    "__rate_interval": "1m",
    "__interval_ms": "15000",
    "__interval": "15s",
    "interval": "15s",
    "__range_s": "1800",
    "__range_ms": "1800000",
    "__range": "30m",
}


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for p in dash.get("panels", []):
        yield p
        yield from p.get("panels", [])


def variables(dash: dict[str, Any]) -> dict[str, str]:
    """Template variables by name: their current value, or a regex matching every value for All."""
    out = {}
    for v in dash.get("templating", {}).get("list", []):
        current = (v.get("current") or {}).get("value")
        if isinstance(current, list):
            current = current[0] if len(current) == 1 else None
        out[v["name"]] = ".+" if current in (None, "", "$__all") else str(current)
    return out


def substitute(expr: str, values: dict[str, str]) -> str:
    """``$name``, ``${name}``, ``${name:fmt}`` and ``[[name]]`` replaced, as Grafana does before querying."""

    def value(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        if name not in values:
            raise KeyError(f"{expr!r}: no value for the variable {name!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", value, expr)


def queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title + refId, PromQL ready to send) of every target of every panel."""
    out = []
    for path in DASHBOARDS:
        dash = load(path)
        values = {**BUILTINS, **variables(dash)}
        for p in panels(dash):
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((path.name, f"{p.get('title')} [{t.get('refId')}]", substitute(t["expr"], values)))
    return out


def prometheus_get(base_url: str, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{base_url}{path}{query}", timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def series_count(base_url: str, promql: str) -> int:
    """How many series an instant query returns (a syntax error raises: HTTP 400)."""
    return len(prometheus_get(base_url, "/api/v1/query", query=promql)["result"])


def empty_queries(base_url: str) -> list[str]:
    """The dashboard queries that return no series (each named by dashboard and panel)."""
    return [f"{file}: {panel}: {q}" for file, panel, q in queries() if series_count(base_url, q) == 0]


def targets_by_job(base_url: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for t in prometheus_get(base_url, "/api/v1/targets", state="active")["activeTargets"]:
        out.setdefault(t["labels"]["job"], []).append(t["health"])
    return out
