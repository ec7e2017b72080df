"""Fork servers (zygotes): members of a local fleet forked from a warm interpreter.

A fresh Python process that imports torch, gymnasium, numpy and zmq spends
1.5-2.5 s of CPU before it does anything; a fleet of seven such processes on two
cores spends most of its start-up there. The launcher instead starts two
zygotes as soon as ``rlfleet up`` runs: ``light`` imports what replay and
paramserver need (no torch, no gymnasium), ``heavy`` also imports torch,
gymnasium and the learner, actor and evaluator. Each then forks one member per
request, in milliseconds.

What makes forking safe here: a zygote is single-threaded in Python, has no
ZeroMQ context, no socket, no torch thread pool started (nothing was computed)
and no logging configured; OpenBLAS's own pool is shut down and restarted by its
fork handlers. A member is forked twice (zygote -> short-lived intermediate ->
member) so that it is reparented to the launcher, a child subreaper
(``PR_SET_CHILD_SUBREAPER``): the launcher waits for it, gets its exit code and
signals it like a process it started itself (:class:`ForkedProcess`). The member
then starts its own session (its own process group: Ctrl-C reaches only the
launcher), writes stdout and stderr to its log, takes the launcher's
environment and working directory, and runs exactly what
``rlfleet service NAME ...`` runs. ``rlfleet service`` itself (containers) stays a
plain process.

A learner that may train on CUDA is never forked (:func:`needs_fresh_process`): CUDA cannot be
used in a child of a process that imported torch's CUDA state, and a zygote must stay free to fork
CPU members; such a learner starts as a fresh process. What the heavy zygote preloads leaves CUDA
uninitialised (tests/unit/cli/test_zygote_cuda.py guards it).

Requests and replies are JSON lines on the zygote's stdin and stdout (never
pickle). Where any of this is unavailable (no subreaper: not Linux; a zygote
that died or answers garbage) the launcher falls back to a fresh process.

This module is the launcher's side; cli/zygote.py is the zygote's. Both import
only the standard library (and common/roles.py) at the top: ``rlfleet up``
starts the zygotes before anything heavy is imported.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import IO

from rlfleet.common.launcher_watch import proc_stat
from rlfleet.common.roles import ROLES

KINDS = ("light", "heavy")
# Which zygote forks which service: the heavy one has torch imported.
KIND_OF = {r.name: "heavy" if r.needs_torch else "light" for r in ROLES}
PR_SET_CHILD_SUBREAPER = 36
ENV_DISABLE = "RLFLEET_FORKSERVER"  # "0": every member is a fresh process, as `rlfleet service` would be
REPLY_TIMEOUT_S = 180.0  # a heavy zygote may still be importing torch on a loaded machine


class ForkServerError(RuntimeError):
    """A zygote could not fork a member (it died, or answered something else)."""


_subreaper: bool | None = None


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False where that is not possible."""
    global _subreaper
    if _subreaper is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            _subreaper = sys.platform.startswith("linux") and libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            _subreaper = False
    return _subreaper


def enabled() -> bool:
    return os.environ.get(ENV_DISABLE, "1") not in ("0", "false", "no", "off") and become_subreaper()


def gpu_visible(environ: Mapping[str, str] = os.environ, dev: Path = Path("/dev")) -> bool:
    """Whether this host shows an NVIDIA GPU to its processes (a device node, and CUDA_VISIBLE_DEVICES
    not hiding every one), without importing torch."""
    if environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return False
    return any(dev.glob("nvidia[0-9]*"))


def needs_fresh_process(service: str, learner_device: str, gpu: bool) -> bool:
    """Whether ``service`` must start as a fresh process rather than be forked by a zygote: a learner
    whose ``learner.device`` is CUDA, or ``auto`` where the host shows a GPU (``gpu``)."""
    if service != "learner":
        return False
    return learner_device.startswith("cuda") or (learner_device == "auto" and gpu)


class ForkedProcess:
    """A member forked by a zygote and reparented to this process: what the launcher needs of a Popen."""

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its code is lost
                self.returncode = -1
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.002
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(pause)
            pause = min(0.05, pause * 2)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """One fork server process, started at once; it imports while the launcher does other things."""

    def __init__(self, kind: str, cwd: str | Path | None = None) -> None:
        self.kind = kind
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.cli.zygote", kind], cwd=cwd, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, start_new_session=True,
        )

    def fork(self, argv: Sequence[str], log_path: Path, cwd: str, env: dict[str, str],
             timeout_s: float = REPLY_TIMEOUT_S) -> ForkedProcess:
        """Fork one member running ``rlfleet ARGV...``; its pid once it exists."""
        request = json.dumps({"argv": list(argv), "log": str(log_path), "cwd": cwd, "env": env,
                              "kind": self.kind}) + "\n"
        with self.lock:
            stdin, stdout = self.proc.stdin, self.proc.stdout
            if self.proc.poll() is not None or stdin is None or stdout is None:
                raise ForkServerError(f"{self.kind} fork server exited ({self.proc.returncode})")
            try:
                stdin.write(request.encode())
                stdin.flush()
                line = _read_line(stdout, timeout_s)
            except (OSError, TimeoutError) as exc:
                raise ForkServerError(f"{self.kind} fork server: {exc}") from None
        try:
            reply = json.loads(line)
            pid = int(reply["pid"])
        except (ValueError, KeyError, TypeError):
            raise ForkServerError(f"{self.kind} fork server answered {line[:200]!r}") from None
        if _parent_of(pid) != os.getpid():  # not reparented to us: we could not wait for it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            raise ForkServerError(f"member {pid} was not reparented to the launcher")
        return ForkedProcess(pid, ["rlfleet", *argv])

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the zygote (its members live on: they are in sessions of their own), even mid-import."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class ForkServers:
    """The launcher's zygotes, one per kind; :meth:`fork` picks the right one for a service."""

    def __init__(self, cwd: str | Path | None = None) -> None:
        if not become_subreaper():
            raise ForkServerError("this process cannot be a child subreaper (Linux only): no fork servers")
        self.zygotes = {kind: Zygote(kind, cwd) for kind in KINDS}

    @classmethod
    def start_if_enabled(cls) -> ForkServers | None:
        return cls() if enabled() else None

    def fork(self, service: str, argv: Sequence[str], log_path: Path,
             env: Mapping[str, str] | None = None) -> ForkedProcess:
        """``env``: the member's environment (default: this process's)."""
        env = dict(os.environ if env is None else env)
        return self.zygotes[KIND_OF[service]].fork(argv, log_path, os.getcwd(), env)

    def close(self) -> None:
        for z in self.zygotes.values():
            z.close()


def _read_line(stream: IO[bytes], timeout_s: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    if not ready:
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    line = stream.readline()
    if not line:
        raise OSError("it exited")
    return line.decode(errors="replace")


def _parent_of(pid: int) -> int | None:
    fields = proc_stat(pid)
    return None if fields is None else int(fields[1])


def reap_orphans(sessions: Collection[int]) -> list[int]:
    """Reap exited processes of the members' sessions that were reparented to this subreaper.

    A member's own children (an ``async`` vector env's workers, say) outlive a member killed
    with SIGKILL; as subreaper the launcher inherits them and, once they exit, holds them as
    zombies until it waits for them. Only processes of ``sessions`` (a member's session is its
    own pid: it calls setsid) are reaped, never a member itself (its ForkedProcess or Popen
    waits for it) nor anything else this process started: a caller's Popen keeps its exit
    status. Returns the pids reaped (Linux; elsewhere nothing is ever reparented here).
    """
    reaped: list[int] = []
    own = os.getpid()
    try:
        tasks = os.listdir(f"/proc/{own}/task")
    except OSError:
        return reaped
    for tid in tasks:
        try:
            children = Path(f"/proc/{own}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for child in children:
            fields = proc_stat(child)
            pid = int(child)
            if fields is None or fields[0] != "Z" or pid in sessions or int(fields[3]) not in sessions:
                continue
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped.append(pid)
            except ChildProcessError:
                pass
    return reaped
