"""`rlfleet up`: the whole fleet on this machine, as processes or in one process.

Starts replay, paramserver, learner, N actors and the evaluator, waits for
them to be healthy, shows a live view scraped from their /metrics, writes the
run directory, and stops everything cleanly (actors first, stores last) on
Ctrl-C/SIGTERM, when the evaluator's mean return reaches the target, or when
time runs out.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from rlfleet.cli import runstart
from rlfleet.cli.dispatch import build
from rlfleet.cli.ending import Ending
from rlfleet.cli.ending import write as write_ending
from rlfleet.cli.env_check import check_env
from rlfleet.cli.fleetview import FleetView, Scrape, last_progress, scrape
from rlfleet.cli.forkserver import (
    ForkedProcess,
    ForkServerError,
    ForkServers,
    gpu_visible,
    needs_fresh_process,
    reap_orphans,
)
from rlfleet.cli.supervision import RestartPolicy
from rlfleet.common import config as config_mod
from rlfleet.common import launcher_watch, security
from rlfleet.common.config import Experiment
from rlfleet.common.envs import EnvError
from rlfleet.common.metrics import MetricsServer
from rlfleet.common.roles import NAMES, ROLES, role
from rlfleet.common.runtime import FatalError, ServiceArgs, setup_logging
from rlfleet.common.wire.transport import free_tcp_port

log = logging.getLogger("rlfleet.up")

# Stop order: those who produce first, those who store last (the roles' start order, reversed).
STOP_ORDER = tuple(reversed(NAMES))

EXIT_TARGET, EXIT_STOPPED, EXIT_FAILED, EXIT_TIMEOUT, EXIT_CONFIG = 0, 130, 1, 3, 2


@dataclass
class Member:
    """One service instance of the fleet."""

    name: str
    shard: int = 0
    actor_id: str | None = None
    metrics_port: int = 0
    proc: subprocess.Popen[bytes] | ForkedProcess | None = None
    thread: threading.Thread | None = None
    service: Any = None
    http: MetricsServer | None = None
    log_path: Path | None = None
    error: BaseException | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        # single roles have one member, but for several learners (learner, learner-1, ...)
        return self.name if role(self.name).single and self.shard == 0 else f"{self.name}-{self.shard}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def exit_code(self) -> int | None:
        if self.proc is not None:
            return self.proc.poll()
        if self.thread is not None and not self.thread.is_alive():
            return 1 if self.error else 0
        return None


def make_run_dir(cfg: Experiment, root: str = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(root) / f"{cfg.name}-{stamp}"
    n = 1
    while run_dir.exists():
        n += 1
        run_dir = Path(root) / f"{cfg.name}-{stamp}-{n}"
    run_dir.mkdir(parents=True)
    return run_dir.resolve()


def plan(cfg: Experiment, actors: int, run_dir: Path, inproc: bool) -> tuple[Experiment, list[Member]]:
    """Addresses, ports and members for a local fleet."""
    if inproc:
        replay = [f"inproc://rlfleet-replay-{i}" for i in range(cfg.replay.shards)]
        params = [f"inproc://rlfleet-paramserver-{i}" for i in range(cfg.paramserver.shards)]
    else:
        replay = [f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(cfg.replay.shards)]
        params = [f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(cfg.paramserver.shards)]
    data = cfg.model_dump(mode="json")
    data["network"].update(replay=replay, paramserver=params, bind_host="127.0.0.1")
    data["actor"]["count"] = actors
    data["run_dir"] = str(run_dir)
    data["metrics"]["host"] = "127.0.0.1"
    if cfg.learners > 1:
        data["learner"]["rendezvous"] = f"tcp://127.0.0.1:{free_tcp_port()}"
    resolved = config_mod.validate(data)
    # an algorithm trained by gradient workers (A3C) needs no replay and no learner: the actors push
    # gradients to the paramserver's shard optimizers
    learns = not cfg.algorithm.trains_with_workers()
    count = {"replay": cfg.replay.shards * learns, "paramserver": cfg.paramserver.shards,
             "learner": cfg.learners * learns, "actor": actors, "evaluator": int(cfg.evaluator.enabled),
             "modeler": int(cfg.planning.enabled), "planner": cfg.planning.planners * cfg.planning.enabled}
    members: list[Member] = []
    for r in ROLES:  # in start order
        for i in range(count[r.name]):
            m = Member(r.name, i)
            if r.registers or r.name == "planner":  # stable ids: actor-0, ..., evaluator (the registry's), planner-0
                m.actor_id = m.label
            members.append(m)
    for m in members:
        m.metrics_port = free_tcp_port()
    return resolved, members


class Fleet:
    """Starts, watches and stops the members of one local run."""

    def __init__(
        self, cfg: Experiment, members: list[Member], run_dir: Path, inproc: bool,
        forkservers: ForkServers | None | bool = True,
    ) -> None:
        """``forkservers``: zygotes that fork the members (cli/forkserver.py); True: start them here
        (unless RLFLEET_FORKSERVER=0 or not on Linux), False/None: every member a fresh interpreter."""
        self.cfg = cfg
        self.members = members
        self.run_dir = run_dir
        self.inproc = inproc
        if forkservers is True:
            forkservers = None if inproc else ForkServers.start_if_enabled()
        self.forkservers: ForkServers | None = forkservers or None
        self.config_path = run_dir / "config.yaml"
        self.config_path.write_text(config_mod.dump(cfg))
        self.sessions: set[int] = set()  # every member process started (each leads its own session)
        (run_dir / "logs").mkdir(exist_ok=True)

    # -- start ---------------------------------------------------------------
    def start(self, stop: threading.Event | None = None, after_stores: Callable[[], None] | None = None) -> None:
        """Start every member (until ``stop`` is set), in the order of ``self.members``: stores first,
        then the learner (the one everyone waits for), the actors, the evaluator. ``after_stores``: called
        once the stores (replay, paramserver) are started, before any other member."""
        # What `rlfleet status --run DIR` reads to find the fleet's endpoints.
        fleet = [{"label": m.label, "service": m.name, "shard": m.shard, "url": m.url} for m in self.members]
        (self.run_dir / "fleet.json").write_text(json.dumps({"inproc": self.inproc, "members": fleet}, indent=1))
        for m in self.members:
            if stop is not None and stop.is_set():
                return
            if after_stores is not None and m.name not in ("replay", "paramserver"):
                after_stores()
                after_stores = None
            m.log_path = self.run_dir / "logs" / f"{m.label}.log"
            if self.inproc:
                self._start_thread(m)
            else:
                self._start_process(m)

    def _start_process(self, m: Member) -> None:
        argv = [
            "service", m.name, "--config", str(self.config_path), "--shard", str(m.shard),
            "--set", f"metrics.port={m.metrics_port}",
        ]
        if m.actor_id:
            argv += ["--actor-id", m.actor_id]
        assert m.log_path is not None
        # the member stops by itself should this process die without stopping it (common/launcher_watch.py)
        env = {**os.environ, launcher_watch.ENV: launcher_watch.identity()}
        if self.forkservers is not None and needs_fresh_process(m.name, self.cfg.learner.device, gpu_visible()):
            log.info("%s: may train on CUDA (learner.device=%s): a fresh process, not forked", m.label,
                     self.cfg.learner.device)
        elif self.forkservers is not None:
            try:
                m.proc = self.forkservers.fork(m.name, argv, m.log_path, env)
                self.sessions.add(m.proc.pid)
                return
            except ForkServerError as exc:
                log.warning("%s: %s; starting it as a fresh process (and every member after it)", m.label, exc)
                self.forkservers.close()
                self.forkservers = None
        cmd = [sys.executable, "-m", "rlfleet.cli", *argv]
        with open(m.log_path, "ab") as out:
            # Own process group: Ctrl-C in the terminal reaches only the launcher,
            # which then stops the fleet in order.
            m.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.sessions.add(m.proc.pid)

    def restart(self, m: Member) -> None:
        """Start a member again whose process exited (or was killed): the same command, the same log."""
        if self.inproc:
            raise FleetError("restart needs a fleet of processes, not --inproc")
        if m.proc is not None and m.proc.poll() is None:
            raise FleetError(f"{m.label} is still running (pid {m.proc.pid})")
        self._start_process(m)

    def _start_thread(self, m: Member) -> None:
        args = ServiceArgs(name=m.name, shard=m.shard, actor_id=m.actor_id)
        m.service = build(self.cfg, args)
        m.http = MetricsServer(m.service.metrics, m.service.health, "127.0.0.1", m.metrics_port).start()

        def run() -> None:
            try:
                m.service.run()
            except BaseException as exc:  # reported by the watcher, with the log
                m.error = exc
                log.exception("%s failed", m.label)
            finally:
                m.service.close()

        m.thread = threading.Thread(target=run, name=m.label, daemon=True)
        m.thread.start()

    def wait_healthy(self, timeout_s: float, stop: threading.Event | None = None) -> None:
        """Block until every member answers /healthz with ok (or ``stop`` is set), or raise."""
        deadline = time.monotonic() + timeout_s
        pending = list(self.members)
        while pending:
            if stop is not None and stop.is_set():
                return
            self.check_alive()
            pending = [m for m in pending if not scrape(m.url, health_only=True).healthy]
            if not pending:
                return
            if time.monotonic() > deadline:
                names = ", ".join(m.label for m in pending)
                raise FleetError(f"not healthy after {timeout_s:.0f} s: {names}; see {self.run_dir}/logs/")
            time.sleep(0.05)

    def check_alive(self) -> None:
        self.reap()
        for m in self.members:
            code = m.exit_code()
            if code is not None:
                raise FleetError(f"{m.label} exited (code {code}) :\n{tail(m.log_path)}")

    def supervise(self, policy: RestartPolicy) -> list[str]:
        """Start again the members that died, as ``policy`` allows; a line for the operator for each.
        Raises FleetError (with the member's log) for one it does not allow, and in --inproc."""
        self.reap()
        lines = []
        for m in self.members:
            code = m.exit_code()
            if code is None:
                continue
            refusal = "--inproc members are threads" if self.inproc else policy.refusal(m.label, code)
            if refusal is not None:
                raise FleetError(f"{m.label} exited (code {code}); not restarted: {refusal}:\n{tail(m.log_path)}")
            self.restart(m)
            lines.append(f"{m.label} exited (code {code}); restarted ({policy.restarts(m.label)} within "
                         f"{policy.window_s:.0f} s; log: {m.log_path})")
        return lines

    def reap(self) -> list[int]:
        """Reap members' children that outlived them (reparented here, the subreaper, as zombies)."""
        reaped = reap_orphans(self.sessions) if self.sessions else []
        if reaped:
            log.debug("reaped %d exited child process(es) of stopped members: %s", len(reaped), reaped)
        return reaped

    # -- stop ----------------------------------------------------------------
    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM group by group (producers first); each group shares one deadline, then SIGKILL."""
        for name in STOP_ORDER:
            group = [m for m in self.members if m.name == name]
            for m in group:
                if m.proc is not None and m.proc.poll() is None:
                    m.proc.send_signal(signal.SIGTERM)
                elif m.service is not None:
                    m.service.stop()
            deadline = time.monotonic() + timeout_s
            for m in group:
                left = max(0.1, deadline - time.monotonic())
                if m.proc is not None:
                    try:
                        m.proc.wait(left)
                    except subprocess.TimeoutExpired:
                        log.warning("%s did not stop within %.0f s; killing it", m.label, timeout_s)
                        m.proc.kill()
                        m.proc.wait(5)
                if m.thread is not None:
                    m.thread.join(left)
                if m.http is not None:
                    m.http.close()
        if self.forkservers is not None:
            self.forkservers.close()
            self.forkservers = None
        self.reap()


class FleetError(RuntimeError):
    """The fleet could not start or a member died."""


def tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join("    " + line for line in text)


@dataclass
class Launched:
    """What :func:`launch` returns: the exit code, and the run directory with its ending (None when the
    run was refused before it had one: a config or env error, said through ``say``)."""

    code: int
    run_dir: Path | None = None
    ending: Ending | None = None


def _echo(message: str, err: bool = False) -> None:
    click.echo(message, err=err)


def run_fleet(
    cfg: Experiment, actors: int, until_return: float | None, max_seconds: float | None, inproc: bool,
    run_root: str = "runs", live: bool | None = None, max_env_steps: int | None = None,
    forkservers: ForkServers | None = None, restart: str = "on-failure", resume: Path | None = None,
    init_from: Path | None = None, started_at: float | None = None,
) -> int:
    """Run a local fleet; returns the process exit code. ``restart``: see cli/supervision.py; ``resume`` and
    ``started_at``: see :func:`launch`."""
    return launch(cfg, actors, until_return, max_seconds, inproc, run_root, live, max_env_steps, forkservers,
                  restart, resume=resume, init_from=init_from, started_at=started_at).code


def launch(
    cfg: Experiment, actors: int, until_return: float | None, max_seconds: float | None, inproc: bool,
    run_root: str = "runs", live: bool | None = None, max_env_steps: int | None = None,
    forkservers: ForkServers | None = None, restart: str = "on-failure",
    say: Callable[[str, bool], None] = _echo, handle_signals: bool = True, progress: bool = True,
    resume: Path | None = None, init_from: Path | None = None, started_at: float | None = None,
) -> Launched:
    """Run a local fleet until a target, a budget, a signal or a failure; writes RUN_DIR/ending.json.

    ``say(message, is_error)`` gets every line for a person. ``handle_signals`` False (the Python API):
    SIGINT and SIGTERM handlers are left as they are, and a KeyboardInterrupt stops the fleet as SIGINT
    would. ``progress`` False: no progress line (the live view or its line every few seconds). ``resume``: a
    run directory to go on in (its services restore their own state from it: the learner's checkpoint, the
    replay snapshots, the paramserver's snapshots, the evaluator's best) instead of a new one; env steps
    and wall seconds count on from its progress.csv, and budgets apply to the totals. ``init_from``: a
    checkpoint whose weights a new run starts from (cli/init_weights.py). ``started_at``: the Unix time the
    command started (default: now); the run clock (progress.csv, the live view, ``max_seconds``) counts from
    it, start-up included, and RUN_DIR/run.json records it with the target and budgets (cli/runstart.py)."""
    started_at = time.time() if started_at is None else started_at
    start = time.monotonic() - max(0.0, time.time() - started_at)
    if inproc and cfg.learners > 1:
        say(f"rlfleet: learners={cfg.learners} needs a fleet of processes (a torch.distributed rank each); "
            "allowed with --inproc: learners=1", True)
        return Launched(EXIT_CONFIG)
    try:
        check_env(cfg, forkservers)
    except EnvError as exc:
        say(f"rlfleet: {exc}", True)
        return Launched(EXIT_CONFIG)
    initial = None
    if init_from is not None:
        from rlfleet.cli.evaluate import CheckpointError
        from rlfleet.cli.init_weights import read_weights

        try:
            initial = read_weights(init_from, cfg)
        except CheckpointError as exc:
            say(f"rlfleet: {exc}", True)
            return Launched(EXIT_CONFIG)
    run_dir = make_run_dir(cfg, run_root) if resume is None else resume.resolve()
    before = None if resume is None else last_progress(run_dir / "progress.csv")
    record = runstart.begin(run_dir, started_at, until_return, max_env_steps, max_seconds,
                            None if resume is None else (before or Scrape()).elapsed)
    cfg, members = plan(cfg, actors, run_dir, inproc)
    try:
        cfg, made = security.local_keys(cfg, run_dir)
    except config_mod.ConfigError as exc:
        say(f"rlfleet: {exc}", True)
        return Launched(EXIT_CONFIG, run_dir)
    if inproc:
        setup_logging("INFO", run_dir / "logs" / "fleet.log")
    say(f"run directory: {run_dir}" + ("" if resume is None else " (resumed" + (
        "" if before is None else f" at {before.env_steps:.0f} env steps, {before.elapsed:.0f} s") + ")"), False)
    if made:
        say(f"security.mode=curve without keys: made a throwaway set in {made[0].path.parent} "
            "(this run only; 'rlfleet keys' makes keys to keep)", False)
    fleet = Fleet(cfg, members, run_dir, inproc, forkservers=forkservers)
    stop = threading.Event()
    reason: list[str] = []

    def on_signal(signum: int, _frame: Any) -> None:
        reason.append(signal.Signals(signum).name)
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if handle_signals else {}
    live = (sys.stdout.isatty() if live is None else live) and progress
    view = FleetView(members, run_dir / "progress.csv", live=live, lines=progress,
                     before=None if resume is None else before or Scrape())
    code = EXIT_FAILED
    how, detail = "failed", "the fleet did not start"
    snap: Scrape | None = None
    try:
        seed_weights = None
        if initial is not None:
            from rlfleet.cli.init_weights import publish_initial

            weights = initial

            def seed_weights() -> None:
                publish_initial(cfg, weights, cfg.network.timeout_s * 6)
                say(f"weights of {init_from} published as version 0", False)

        fleet.start(stop, after_stores=seed_weights)
        fleet.wait_healthy(cfg.network.timeout_s * 6, stop)
        if record.ready_s is None:
            record.ready_s = round(time.monotonic() - start + record.clock[-1][1], 3)
            runstart.write(run_dir, record)
        policy = RestartPolicy(restart)
        while not stop.wait(1.0):
            for line in fleet.supervise(policy):
                say(f"rlfleet: {line}", True)
            snap = view.update(time.monotonic() - start)
            if until_return is not None and snap.eval_return is not None and snap.eval_return >= until_return:
                how = "target"
                detail = (f"eval return {snap.eval_return:.1f} >= {until_return:g} after {snap.elapsed:.0f} s, "
                          f"{snap.env_steps:.0f} env steps")
                say(f"target reached: {detail}", False)
                code = EXIT_TARGET
                break
            out_of_time = max_seconds is not None and snap.elapsed >= max_seconds
            out_of_steps = max_env_steps is not None and snap.env_steps >= max_env_steps
            if out_of_time or out_of_steps:
                best = "none yet" if view.best_return is None else f"{view.best_return:.1f}"
                target = f"eval return {until_return:g}" if until_return is not None else "the end"
                budget = f"time is up ({max_seconds:g} s)" if out_of_time else \
                    f"env-step budget spent ({snap.env_steps:.0f} >= {max_env_steps})"
                how, detail = "budget", f"{budget} before {target}"
                say(f"rlfleet: {budget} before {target}; best eval return: {best}", True)
                code = EXIT_TIMEOUT if until_return is not None else EXIT_TARGET
                break
        else:
            how, detail = "stopped", f"on {reason[0] if reason else 'request'}"
            say(f"stopping {detail}", False)
            code = EXIT_STOPPED if until_return is not None else EXIT_TARGET
    except (FleetError, FatalError, EnvError) as exc:  # the last two: an --inproc member could not start
        say(f"rlfleet: {exc}", True)
        how, detail, code = "failed", str(exc).splitlines()[0], EXIT_FAILED
    except KeyboardInterrupt:
        if handle_signals:
            raise
        how, detail = "stopped", "on KeyboardInterrupt"
        code = EXIT_STOPPED if until_return is not None else EXIT_TARGET
    finally:
        view.close()
        fleet.stop()
        for s, h in old.items():
            signal.signal(s, h)
        wall = snap.elapsed if snap is not None else 0.0
        ending = Ending(how, detail, code, int(snap.env_steps) if snap is not None else 0, wall, started_at,
                        view.best_return, until_return, max_env_steps, max_seconds)
        write_ending(run_dir, ending)
        say(f"stopped; logs, progress.csv and checkpoints in {run_dir}", False)
    return Launched(code, run_dir, ending)
