"""The zygote's side of the launcher's fork servers (cli/forkserver.py explains them): import what a kind
of member needs, then fork one member per request read on stdin, and answer its pid on stdout.

    python -m rlfleet.cli.zygote light|heavy     (started by the launcher)
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import sys
import threading
import time
from typing import Any

from rlfleet.cli.forkserver import KIND_OF, KINDS
from rlfleet.common.roles import ROLES

# What each zygote imports before it forks anything: what its kind of member needs, then the entry module of
# every role it forks (and what their build imports on first use).
BASE_PRELOAD: dict[str, tuple[str, ...]] = {
    "light": ("numpy", "zmq", "rlfleet.cli.main", "rlfleet.cli.dispatch", "rlfleet.common.runtime"),
    "heavy": ("numpy", "zmq", "torch", "torch.utils.tensorboard", "gymnasium", "gymnasium.envs.classic_control",
              "rlfleet.cli.main", "rlfleet.cli.dispatch", "rlfleet.common.runtime", "rlfleet.common.envs",
              "rlfleet.common.algorithms.dqn.learner", "rlfleet.common.algorithms.ppo.learner"),
}
PRELOAD: dict[str, tuple[str, ...]] = {
    kind: tuple(dict.fromkeys([*BASE_PRELOAD[kind], *(module for r in ROLES if KIND_OF[r.name] == kind
                                                      for module in (r.entry, *r.preload))]))
    for kind in KINDS
}
PR_SET_NAME = 15


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
    from rlfleet.cli.main import main

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
    while True:
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
    """Lines from a pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""

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
        sys.exit(f"usage: python -m rlfleet.cli.zygote {'|'.join(KINDS)}")
    sys.exit(serve(sys.argv[1]))
