"""`rlfleet status`: one table of a running fleet's health and key figures.

Finds the fleet's /metrics + /healthz endpoints from a local run's
``fleet.json`` (``--run RUN_DIR``, written by `rlfleet up`), from URLs given
(``--url``, repeatable), or from a Docker Compose project (``--compose NAME``:
the project's running containers, by the ``com.docker.compose.project`` label,
scraped on their container IP at ``--port``, default 9100). Scrapes twice,
``--interval`` apart, to show rates. Exit code 0 when every member is healthy,
1 otherwise, 2 when no member could be found.

A finished run (``--run`` on a directory with ``ending.json``, written by `rlfleet up` and
`rlfleet train` when they stop) is not scraped: status says how it ended (target reached, budget
spent, stopped, failed) and exits 0.

A compose project's Prometheus and Grafana (profile ``monitoring``) have no
rlfleet /healthz: each is read on its own port, Prometheus (9090) healthy when
/-/ready answers 200, with how many of its scrape targets are up
(/api/v1/targets), Grafana (3000) when /api/health answers 200.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from rlfleet.cli import ending
from rlfleet.cli.fleetview import fetch


class StatusError(ValueError):
    """No fleet to look at: the message says why."""


#: Compose services that are not rlfleet services, by name: the port they listen on in their container.
MONITORING_PORTS = {"prometheus": 9090, "grafana": 3000}


@dataclass
class Target:
    label: str
    url: str
    service: str = ""  # filled from the metrics' service label when unknown
    kind: str = "rlfleet"  # or "prometheus", "grafana": see read_monitoring()


@dataclass
class Reading:
    reachable: bool = False
    healthy: bool = False
    health: dict[str, Any] = field(default_factory=dict)
    service: str = ""
    shard: str = ""
    samples: dict[str, float] = field(default_factory=dict)  # name -> summed over label sets


def read(url: str, timeout_s: float = 2.0) -> Reading:
    """Health and metrics of one endpoint; unreachable is a reading, not an error."""
    out = Reading()
    try:
        code, body = fetch(url.rstrip("/") + "/healthz", timeout_s)
        out.reachable = True
        out.health = json.loads(body or b"{}")
        out.healthy = code == 200 and bool(out.health.get("ok"))
        _, text = fetch(url.rstrip("/") + "/metrics", timeout_s)
        for family in text_string_to_metric_families(text.decode()):
            for s in family.samples:
                out.samples[s.name] = out.samples.get(s.name, 0.0) + s.value
                if not out.service and "service" in s.labels:
                    out.service, out.shard = s.labels["service"], s.labels.get("shard", "")
    except (OSError, ValueError):
        out.healthy = False
    return out


def read_prometheus(url: str, timeout_s: float = 2.0) -> Reading:
    """A Prometheus server: healthy when /-/ready answers 200; its active targets counted by health
    (samples ``targets_up`` and ``targets``, and ``down_jobs`` in health)."""
    out = Reading(service="prometheus")
    try:
        code, _ = fetch(url.rstrip("/") + "/-/ready", timeout_s)
        out.reachable = True
        out.healthy = code == 200
        _, body = fetch(url.rstrip("/") + "/api/v1/targets?state=active", timeout_s)
        active = json.loads(body)["data"]["activeTargets"]
        up = [t for t in active if t.get("health") == "up"]
        out.samples = {"targets_up": float(len(up)), "targets": float(len(active))}
        down = sorted({t.get("labels", {}).get("job", "?") for t in active if t.get("health") != "up"})
        out.health = {"ok": out.healthy, "down_jobs": down}
    except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException):
        out.healthy = False
    return out


def read_grafana(url: str, timeout_s: float = 2.0) -> Reading:
    """A Grafana server: healthy when /api/health answers 200 (its database is reachable)."""
    out = Reading(service="grafana")
    try:
        code, body = fetch(url.rstrip("/") + "/api/health", timeout_s)
        out.reachable = True
        out.health = dict(json.loads(body or b"{}"))
        out.healthy = code == 200
    except (OSError, ValueError, TypeError, http.client.HTTPException):
        out.healthy = False
    return out


def read_monitoring(t: Target) -> tuple[Reading, str]:
    """The reading and key figures of a Prometheus or Grafana target."""
    if t.kind == "grafana":
        now = read_grafana(t.url)
        return now, f"version {now.health.get('version', '-')}, database {now.health.get('database', '-')}"
    now = read_prometheus(t.url)
    if "targets" not in now.samples:
        return now, "ready" if now.healthy else "not ready"
    text = f"targets up {now.samples['targets_up']:.0f}/{now.samples['targets']:.0f}"
    down = now.health.get("down_jobs") or []
    return now, text + (f" (down: {', '.join(down)})" if down else "")


def targets_from_run(run_dir: str | Path) -> list[Target]:
    path = Path(run_dir) / "fleet.json"
    if not path.is_file():
        raise StatusError(f"{path} does not exist: is {run_dir} a run of `rlfleet up`?")
    try:
        data = json.loads(path.read_text())
        return [Target(m["label"], m["url"], m.get("service", "")) for m in data["members"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise StatusError(f"{path}: not a fleet description ({exc})") from None


def targets_from_compose(project: str, port: int) -> list[Target]:
    """Running containers of a compose project, by their IP on the project's network."""
    try:
        import docker

        client = docker.from_env(timeout=10)
        containers = client.containers.list(filters={"label": f"com.docker.compose.project={project}"})
    except Exception as exc:  # no daemon, no permission, no SDK
        raise StatusError(f"cannot list containers of compose project {project!r}: {exc}") from None
    out = []
    for c in sorted(containers, key=lambda c: c.name):
        labels = c.labels or {}
        service = labels.get("com.docker.compose.service", c.name)
        number = labels.get("com.docker.compose.container-number", "1")
        networks = (c.attrs.get("NetworkSettings") or {}).get("Networks") or {}
        ip = next((n.get("IPAddress") for n in networks.values() if n.get("IPAddress")), None)
        if not ip:
            continue
        if service in MONITORING_PORTS:
            out.append(Target(f"{service}-{number}", f"http://{ip}:{MONITORING_PORTS[service]}", service, service))
        else:
            out.append(Target(f"{service}-{number}", f"http://{ip}:{port}", service))
    if not out:
        raise StatusError(f"compose project {project!r} has no running container with an IP")
    return out


def _f(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def figures(service: str, now: Reading, before: Reading | None, dt: float) -> str:
    """Key figures of one service as 'name value' pairs."""
    s = now.samples

    def rate(name: str) -> float | None:
        if before is None or dt <= 0 or name not in s or name not in before.samples:
            return None
        return max(0.0, s[name] - before.samples[name]) / dt

    def g(name: str) -> float | None:
        return s.get(name)

    if service == "actor":
        parts = [f"env steps {_f(g('rlfleet_env_steps_total'))}", f"{_f(rate('rlfleet_env_steps_total'))}/s",
                 f"return {_f(g('rlfleet_episode_return'), '.1f')}", f"weights v{_f(g('rlfleet_weights_version'))}",
                 f"staleness {_f(g('rlfleet_weights_staleness'))}"]
    elif service == "learner":
        parts = [f"updates {_f(g('rlfleet_learner_updates_total'))}",
                 f"{_f(rate('rlfleet_learner_updates_total'), '.1f')}/s",
                 f"version v{_f(g('rlfleet_learner_version'))}", f"loss {_f(g('rlfleet_learner_loss'), '.4f')}"]
    elif service == "replay":
        parts = [f"size {_f(g('rlfleet_replay_size'))}", f"inserts {_f(rate('rlfleet_replay_inserts_total'))}/s",
                 f"samples {_f(rate('rlfleet_replay_samples_total'))}/s"]
    elif service == "paramserver":
        parts = [f"version v{_f(g('rlfleet_paramserver_version'))}",
                 f"live actors {_f(g('rlfleet_paramserver_live_actors'))}"]
        if g("rlfleet_paramserver_gradients_applied_total"):  # gradient workers push to it
            parts.append(f"pushes {_f(rate('rlfleet_paramserver_gradients_applied_total'), '.1f')}/s")
    elif service == "evaluator":
        parts = [f"return {_f(g('rlfleet_eval_return'), '.1f')}", f"+- {_f(g('rlfleet_eval_return_std'), '.1f')}",
                 f"of v{_f(g('rlfleet_eval_version'))}", f"evaluations {_f(g('rlfleet_evaluations_total'))}"]
    elif service == "modeler":
        parts = [f"updates {_f(g('rlfleet_modeler_updates_total'))}",
                 f"val error {_f(g('rlfleet_modeler_val_error'), '.4f')}",
                 f"gate {'open' if g('rlfleet_modeler_gate_open') else 'closed'}",
                 f"version v{_f(g('rlfleet_modeler_version'))}"]
    elif service == "planner":
        parts = [f"imagined {_f(rate('rlfleet_planner_imagined_inserts_total'))}/s",
                 f"gate {'open' if g('rlfleet_planner_gate_open') else 'closed'}",
                 f"model v{_f(g('rlfleet_planner_model_version'))}", f"weights v{_f(g('rlfleet_weights_version'))}"]
    else:
        parts = []
    errors = g("rlfleet_protocol_errors_total")
    if errors:
        parts.append(f"protocol errors {errors:.0f}")
    wal_failures = g("rlfleet_replay_wal_failures_total")  # a full or failing disk under a wal replay
    if wal_failures:
        parts.append(f"wal failures {wal_failures:.0f}")
    return ", ".join(parts)


def collect_status(targets: list[Target], interval_s: float) -> list[dict[str, Any]]:
    """One row per target: label, service, url, reachable, healthy, figures."""
    first: list[Reading | None] = [None] * len(targets)
    if interval_s > 0:  # rates of rlfleet services only
        first = [read(t.url) if t.kind == "rlfleet" else None for t in targets]
        time.sleep(interval_s)
    rows = []
    for t, before in zip(targets, first, strict=True):
        if t.kind != "rlfleet":
            now, text = read_monitoring(t)
        else:
            now = read(t.url)
            text = figures(t.service or now.service, now, before, interval_s)
        service = t.service or now.service
        rows.append({"label": t.label, "service": service, "url": t.url, "reachable": now.reachable,
                     "healthy": now.healthy, "figures": text if now.reachable else "unreachable",
                     "health": now.health})
    return rows


def show_ending(run_dir: str | Path, as_json: bool) -> None:
    """How a finished run ended (its ending.json), for a person or as JSON."""
    end = ending.read(run_dir)
    if as_json:
        click.echo(json.dumps({"run": str(run_dir), "finished": True, **asdict(end)}, indent=1))
    else:
        click.echo(f"{run_dir}: finished, {end.summary()}; exit code {end.code}")


@click.command("status")
@click.option("--run", "run_dir", type=click.Path(file_okay=False), default=None,
              help="a local run directory (reads its fleet.json)")
@click.option("--url", "urls", multiple=True, help="a service's metrics base URL, e.g. http://127.0.0.1:9100")
@click.option("--compose", "project", default=None, help="a Docker Compose project name")
@click.option("--port", type=int, default=9100, show_default=True, help="metrics port inside containers")
@click.option("--interval", type=float, default=1.0, show_default=True,
              help="seconds between the two scrapes that give rates (0: one scrape, no rates)")
@click.option("--json", "as_json", is_flag=True, help="print JSON rows instead of a table")
def status(run_dir: str | None, urls: tuple[str, ...], project: str | None, port: int, interval: float,
           as_json: bool) -> None:
    """Health and key figures of a running fleet, one row per service."""
    try:
        if sum(x is not None and x != () for x in (run_dir, urls, project)) != 1:
            raise StatusError("give exactly one of --run RUN_DIR, --url URL (repeatable), --compose PROJECT")
        if run_dir is not None and (Path(run_dir) / ending.FILE).is_file():
            show_ending(run_dir, as_json)
            sys.exit(0)
        if run_dir is not None:
            targets = targets_from_run(run_dir)
        elif project is not None:
            targets = targets_from_compose(project, port)
        else:
            targets = [Target(u, u) for u in urls]
    except (StatusError, ending.EndingError) as exc:
        click.echo(f"rlfleet status: {exc}", err=True)
        sys.exit(2)
    rows = collect_status(targets, interval)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    else:
        table = Table(title="rlfleet status", show_header=True)
        for col in ("member", "service", "healthy", "key figures"):
            table.add_column(col)
        for r in rows:
            ok = "[green]yes[/green]" if r["healthy"] else ("[red]no[/red]" if r["reachable"] else "[red]down[/red]")
            table.add_row(r["label"], r["service"], ok, r["figures"])
        Console(width=max(120, Console().width)).print(table)
    sys.exit(0 if rows and all(r["healthy"] for r in rows) else 1)
