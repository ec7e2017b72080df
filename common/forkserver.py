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

Requests and replies are JSON lines on the zygote's stdin and stdout (never
pickle). Where any of this is unavailable (no subreaper: not Linux; a zygote
that died or answers garbage) the launcher falls back to a fresh process.

    python -m common.forkserver light|heavy     (started by the launcher)
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import IO, Any

KINDS = ("light", "heavy")
# What each zygote imports before it forks anything.
PRELOAD: dict[str, tuple[str, ...]] = {
    "light": ("numpy", "zmq", "common.cli", "common.runtime", "services.replay.main", "services.paramserver.main"),
    "heavy": ("numpy", "zmq", "torch", "torch.utils.tensorboard", "gymnasium", "gymnasium.envs.classic_control",
              "common.cli", "common.runtime", "common.envs", "common.algorithms.dqn", "services.learner.main",
              "services.actor.actor", "services.actor.evaluator", "services.actor.main"),
}
# Imported once nothing waits to be forked: torch._dynamo (+ sympy, ~2 s of CPU), which a torch optimizer
# imports on first use. A learner forked before that imports it itself (one core) while the zygote forks the
# actors and the evaluator (the other core); a learner forked after it (a restart) starts at once.
IDLE_PRELOAD: dict[str, tuple[str, ...]] = {"light": (), "heavy": ("torch._dynamo",)}
# Which zygote forks which service.
KIND_OF = {"replay": "light", "paramserver": "light", "learner": "heavy", "actor": "heavy", "evaluator": "heavy"}
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NAME = 15
ENV_DISABLE = "RLFLEET_FORKSERVER"  # "0": every member is a fresh process, as `rlfleet service` would be
REPLY_TIMEOUT_S = 180.0  # a heavy zygote may still be importing torch on a loaded machine


class ForkServerError(RuntimeError):
    """A zygote could not fork a member (it died, or answered something else)."""


# -- the launcher's side ----------------------------------------------------------------------------------

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
            [sys.executable, "-m", "common.forkserver", kind], cwd=cwd, stdin=subprocess.PIPE,
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

    def fork(self, service: str, argv: Sequence[str], log_path: Path) -> ForkedProcess:
        env = dict(os.environ)
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
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat after the command name (state is [0], ppid [1], session [3]); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


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
            fields = _stat_fields(child)
            pid = int(child)
            if fields is None or fields[0] != "Z" or pid in sessions or int(fields[3]) not in sessions:
                continue
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped.append(pid)
            except ChildProcessError:
                pass
    return reaped


# -- the zygote's side ------------------------------------------------------------------------------------

def _member(request: dict[str, Any], requests_fd: int, replies_fd: int) -> int:
    """In the forked member: become a process of its own, then run `rlfleet ARGV...`."""
    os.close(requests_fd)
    os.close(replies_fd)
    os.setsid()  # own session and process group, as the launcher's start_new_session=True
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdout.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    argv = [str(a) for a in request["argv"]]
    sys.argv = ["rlfleet", *argv]
    _set_name(f"rlfleet-{argv[1] if len(argv) > 1 else 'member'}")
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
    sys.stderr.write(f"{stamp} INFO rlfleet.forkserver: pid {os.getpid()} forked by the "
                     f"{request.get('kind', '?')} fork server: rlfleet {' '.join(argv[:2])}\n")
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS
        sys.modules["numpy"].random.seed()
    from common.cli import main

    try:
        main(args=argv, prog_name="rlfleet", standalone_mode=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # what a fresh interpreter would print before exiting 1
        import traceback

        traceback.print_exc()
        code = 1
    return code


def _set_name(name: str) -> None:
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, name[:15].encode(), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _fork_member(request: dict[str, Any], requests_fd: int, replies_fd: int) -> int:
    """Fork twice; the member's pid. The intermediate exits at once, so the member is reparented."""
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:  # intermediate
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:  # the member
                os.close(w)
                code = 1
                try:
                    code = _member(request, requests_fd, replies_fd)
                finally:
                    _exit(code)
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        text = f.read()
    os.waitpid(mid, 0)
    return int(text)


def _exit(code: int) -> None:
    """The end of a member: what interpreter shutdown does that matters (atexit, flushes), then exit."""
    import atexit

    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve(kind: str) -> int:
    requests_fd, replies_fd = os.dup(0), os.dup(1)
    os.set_inheritable(requests_fd, False)
    os.set_inheritable(replies_fd, False)
    os.dup2(2, 1)  # whatever an import prints goes to stderr, never into the replies
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _set_name(f"rlfleet-zygote-{kind}"[:15])
    for module in PRELOAD[kind]:
        importlib.import_module(module)
    requests = _Lines(requests_fd)
    replies = os.fdopen(replies_fd, "wb", buffering=0)
    idle = list(IDLE_PRELOAD[kind])
    while True:
        if idle and not requests.pending():
            importlib.import_module(idle.pop(0))
            continue
        line = requests.readline()
        if not line:
            return 0  # the launcher closed our stdin (or died): members live on without us
        try:
            request = json.loads(line)
            if threading.active_count() != 1:
                raise RuntimeError(f"{threading.active_count()} threads: forking is unsafe")
            reply: dict[str, Any] = {"pid": _fork_member(request, requests_fd, replies_fd)}
        except Exception as exc:  # noqa: BLE001 (the launcher falls back to a fresh process)
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write((json.dumps(reply) + "\n").encode())


class _Lines:
    """Lines from a pipe, with a non-blocking look at whether one is waiting."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""

    def pending(self) -> bool:
        return b"\n" in self.buf or bool(select.select([self.fd], [], [], 0)[0])

    def readline(self) -> bytes:
        """One line with its newline; b"" at EOF."""
        while b"\n" not in self.buf:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return b""
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line + b"\n"


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in KINDS:
        sys.exit(f"usage: python -m common.forkserver {'|'.join(KINDS)}")
    sys.exit(serve(sys.argv[1]))
