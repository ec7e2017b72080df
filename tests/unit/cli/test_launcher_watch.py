"""common/launcher_watch.py: a process named by pid and start time, alive or not, and the watch's call."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from rlfleet.common.launcher_watch import ENV, alive, identity, watch_launcher


def test_a_process_is_alive_until_it_exits_and_then_never_again() -> None:
    assert alive(identity())  # this process
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        named = identity(child.pid)
        assert alive(named)
        pid, _, start = named.partition(":")
        assert not alive(f"{pid}:{int(start) + 1}")  # the same pid, started at another time: another process
        child.kill()
        deadline = time.monotonic() + 10
        while alive(named) and time.monotonic() < deadline:  # a zombie until waited for: not alive either
            time.sleep(0.01)
        assert not alive(named)
    finally:
        child.kill()
        child.wait()
    assert not alive(named)  # reaped: no such process


def test_the_watch_calls_once_when_the_launcher_is_gone_and_not_without_one() -> None:
    assert watch_launcher(lambda: None, environ={}) is None  # a service started by hand: no watch
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    called = threading.Event()
    calls: list[float] = []

    def gone() -> None:
        calls.append(time.monotonic())
        called.set()

    watch = watch_launcher(gone, environ={ENV: identity(child.pid)}, every_s=0.05)
    assert watch is not None
    try:
        assert not called.wait(0.3)  # alive: no call
        child.kill()
        child.wait()
        assert called.wait(10)
        watch.thread.join(5)
        assert not watch.thread.is_alive() and len(calls) == 1
    finally:
        watch.stop()
        if child.poll() is None:
            child.kill()
