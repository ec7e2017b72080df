"""Start paramserver shards as local processes, or one shard's loop in a thread of this process.

For tests and benchmarks only (harness/ is what both share).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.errors import CommTimeout
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.paramserver.shard import ShardServer

ROOT = Path(__file__).resolve().parents[1]
S = TypeVar("S", bound=ShardServer)


@contextmanager
def serving(server: S, timeout_s: float = 10.0) -> Iterator[S]:
    """Run ``server``'s loop in a thread; on exit stop it, join the thread and close the server."""
    thread = threading.Thread(target=server.serve, name=server.name, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop()
        thread.join(timeout_s)
        server.close()


class ShardProcesses:
    """``num_shards`` shard servers, one process each, on free tcp ports of 127.0.0.1."""

    def __init__(self, num_shards: int, liveness_s: float = 5.0, extra_sets: Sequence[str] = (),
                 log_level: str = "WARNING") -> None:
        self.addresses = [f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(num_shards)]
        sets = [
            f"network.paramserver={json.dumps(self.addresses)}",
            f"paramserver.shards={num_shards}",
            f"paramserver.liveness_timeout_s={liveness_s}",
            "network.bind_host=127.0.0.1",
            "metrics.port=0",
            "metrics.host=127.0.0.1",
            *extra_sets,
        ]
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.cmds: list[list[str]] = []
        for shard in range(num_shards):
            cmd = [sys.executable, "-m", "rlfleet.services.paramserver.main", "--shard", str(shard),
                   "--log-level", log_level]
            for s in sets:
                cmd += ["--set", s]
            self.cmds.append(cmd)
        self.procs: list[subprocess.Popen[bytes]] = [subprocess.Popen(c, cwd=ROOT, env=self.env) for c in self.cmds]

    def restart(self, shard: int) -> None:
        """Start shard ``shard`` again (after it stopped) on the same address; wait until it answers."""
        assert self.procs[shard].poll() is not None, "stop the shard first"
        self.procs[shard] = subprocess.Popen(self.cmds[shard], cwd=ROOT, env=self.env)
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 30.0) -> ShardProcesses:
        """Block until every shard answers ``info``."""
        deadline = time.monotonic() + timeout_s
        for shard, addr in enumerate(self.addresses):
            with Connection(addr, "launcher") as c:
                while True:
                    if self.procs[shard].poll() is not None:
                        raise RuntimeError(f"paramserver shard {shard} exited with {self.procs[shard].returncode}")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise CommTimeout(f"paramserver shard {shard} at {addr} not ready in {timeout_s} s")
                    try:
                        c.request(Message("info"), min(0.5, left))
                        break
                    except CommTimeout:
                        continue
        return self

    def close(self, timeout_s: float = 10.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def __enter__(self) -> ShardProcesses:
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.close()
