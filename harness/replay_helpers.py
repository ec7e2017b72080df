"""Helpers for the replay tests: an in-thread server, a replay process, and a writer process.

Run as a script, this is the writer process of the exactly-once test:
    python harness/replay_helpers.py writer ADDRESS WRITER_INDEX COUNT BATCH DUP_EVERY RESEND_AFTER_S
or a wal replay server whose files may not grow beyond FSIZE_LIMIT bytes (RLIMIT_FSIZE) until it
gets SIGUSR1; it prints its endpoint:
    python harness/replay_helpers.py limited-wal-server DIRECTORY FSIZE_LIMIT
or the replay service whose next wal fsync fails (EIO) once it gets SIGUSR2:
    python harness/replay_helpers.py failing-fsync-replay [services.replay.main's options]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlfleet.common.config import ReplayConfig, TableConfig  # noqa: E402
from rlfleet.common.metrics import ServiceMetrics  # noqa: E402
from rlfleet.common.wire.codec import Message, encode  # noqa: E402
from rlfleet.common.wire.decoder import decode  # noqa: E402
from rlfleet.common.wire.transport import free_tcp_port, make_socket  # noqa: E402
from rlfleet.services.replay.server import ReplayServer  # noqa: E402

PYTHON = str(ROOT / ".venv" / "bin" / "python")


def replay_config(**table: Any) -> ReplayConfig:
    t = {"name": "main", "kind": "uniform", "capacity": 1000, "min_size": 1, **table}
    return ReplayConfig(tables=[TableConfig(**t)])


@contextlib.contextmanager
def serving(cfg: ReplayConfig, directory: Path | None = None, bind: str = "tcp://127.0.0.1:0",
            **kw: Any) -> Iterator[ReplayServer]:
    """A ReplayServer on ``bind`` (a free tcp port), served by a thread; stopped and closed on exit."""
    server = ReplayServer(cfg, ServiceMetrics("replay"), bind, directory=directory, **kw)
    server.restore()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop()
        thread.join(10)
        server.close()


def ask(endpoint: str, msg: Message, sender: str = "raw", seq: int = 1, timeout_s: float = 10.0) -> Message:
    """One request over a fresh DEALER socket; its reply (AssertionError if none within timeout_s)."""
    sock = make_socket(zmq.DEALER, connect=endpoint)
    try:
        msg.sender, msg.seq = sender, seq
        sock.send_multipart(encode(msg))
        assert sock.poll(int(timeout_s * 1000)), f"no reply to {msg.type} within {timeout_s} s"
        return decode(sock.recv_multipart())
    finally:
        sock.close(linger=0)


def transitions(writer: int, start: int, n: int) -> dict[str, np.ndarray]:
    """CartPole-shaped transitions that name themselves: (writer, idx)."""
    idx = np.arange(start, start + n, dtype=np.int64)
    obs = np.stack([idx, idx + 1, idx + 2, idx + 3], axis=1).astype(np.float32)
    return {"obs": obs, "action": idx % 2, "reward": np.ones(n, np.float32), "next_obs": obs + 1,
            "done": (idx % 50) == 49, "writer": np.full(n, writer, np.int32), "idx": idx}


class ReplayProcess:
    """``python -m services.replay.main`` on a fixed port, with its log in a file."""

    def __init__(self, run_dir: Path, port: int | None = None, sets: tuple[str, ...] = (),
                 command: tuple[str, ...] = ("-m", "rlfleet.services.replay.main")) -> None:
        self.command = command  # what the venv's python runs, before the --set options
        self.run_dir = run_dir
        self.port = port or free_tcp_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.sets = [f"run_dir={run_dir}", f"network.replay=[{self.address}]", "metrics.port=0",
                     "network.bind_host=127.0.0.1",
                     "replay.tables.0.columns=first_insert", *sets]  # the tests' own columns
        self.log_path = run_dir / f"replay-{time.monotonic_ns()}.log"  # one per process
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ReplayProcess:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        args = [PYTHON, *self.command]
        for s in self.sets:
            args += ["--set", s]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT)
        return self

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_log(self, text: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log():
            assert self.proc is not None and self.proc.poll() is None, f"replay exited:\n{self.log()}"
            assert time.monotonic() < deadline, f"{text!r} not logged within {timeout_s} s:\n{self.log()}"
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def writer_main(address: str, index: int, count: int, batch: int, dup_every: int, resend_after_s: float) -> None:
    from rlfleet.common.clients.replay_insert import InsertClient

    client = InsertClient(address, f"writer-{index}", max_unacked=8, resend_after_s=resend_after_s)
    sent = 0
    k = 0
    while sent < count:
        n = min(batch, count - sent)
        seq = client.insert("main", transitions(index, sent, n), timeout_s=60)
        k += 1
        if dup_every and k % dup_every == 0:
            client.resend(seq)  # a deliberate duplicate, sent before the ack can arrive
        sent += n
    client.flush(60)
    print(json.dumps({"acked": client.acked, "duplicates": client.duplicates, "resends": client.resends,
                      "items": client.items_acked}))
    client.close()


def limited_wal_server_main(directory: str, fsize_limit: int, kind: str = "uniform") -> None:
    """A wal ReplayServer whose writes past ``fsize_limit`` bytes of a file fail (EFBIG), as on a full
    disk, until SIGUSR1 lifts the limit; SIGUSR2 sets it to the current log segment's size (full now).
    Stopped by SIGTERM, it prints its metrics (Prometheus text) on stdout after its endpoint."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
    signal.signal(signal.SIGUSR1, lambda *_: resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard)))
    signal.signal(signal.SIGUSR2, lambda *_: resource.setrlimit(
        resource.RLIMIT_FSIZE, (max(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file()), hard)))
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, hard))
    cfg = ReplayConfig(tables=[TableConfig(name="main", kind=kind, capacity=100_000, min_size=1)],  # type: ignore[arg-type]
                       durability="wal", checkpoint_every_s=3600)
    server = ReplayServer(cfg, ServiceMetrics("replay"), "tcp://127.0.0.1:0", directory=directory)
    server.restore()
    print(server.endpoint, flush=True)
    server.serve()
    server.close()
    sys.stdout.write(server.metrics.exposition().decode())  # after SIGTERM: what Prometheus would scrape


def failing_fsync_replay_main(argv: list[str]) -> int:
    """``rlfleet.services.replay.main`` whose next fsync of a wal segment fails with EIO after SIGUSR2, once:
    later fsyncs succeed again, as Linux's may after it dropped the lost pages (a real EIO needs a
    failing disk or device-mapper, which this machine's kernel lacks)."""
    import errno

    from rlfleet.services.replay import main as replay_main

    real_fsync = os.fsync
    armed = threading.Event()

    def fsync(fd: int) -> None:
        if armed.is_set() and os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith("wal-"):
            armed.clear()
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    os.fsync = fsync  # type: ignore[assignment]  # this process only: a replay whose fsync fails on demand
    def arm(*_: Any) -> None:
        armed.set()
        os.write(2, b"fsync armed\n")  # for the test to wait on

    signal.signal(signal.SIGUSR2, arm)
    return replay_main.main(argv)


if __name__ == "__main__":
    if sys.argv[1] == "writer":
        a = sys.argv[2:]
        writer_main(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), float(a[5]))
    elif sys.argv[1] == "failing-fsync-replay":
        raise SystemExit(failing_fsync_replay_main(sys.argv[2:]))
    elif sys.argv[1] == "limited-wal-server":
        limited_wal_server_main(sys.argv[2], int(sys.argv[3]), *sys.argv[4:5])
