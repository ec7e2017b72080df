"""One service as a real process (`rlfleet service NAME`), its /metrics and its log, for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
CARTPOLE = ROOT / "configs" / "cartpole-dqn.yaml"
sys.path.insert(0, str(ROOT))

from rlfleet.common.wire.transport import free_tcp_port  # noqa: E402


class ServiceProcess:
    """``rlfleet service NAME --set ...`` with metrics on a free port of 127.0.0.1 and its log in a file."""

    def __init__(self, name: str, run_dir: Path, sets: list[str], shard: int = 0,
                 config: Path = CARTPOLE) -> None:
        self.name = name
        self.metrics_port = free_tcp_port()
        self.log_path = run_dir / f"{name}-{shard}-{time.monotonic_ns()}.log"
        cmd = [sys.executable, "-m", "rlfleet.cli", "service", name, "--shard", str(shard), "--config", str(config)]
        for s in [f"run_dir={run_dir}", "network.bind_host=127.0.0.1", "metrics.host=127.0.0.1",
                  f"metrics.port={self.metrics_port}", *sets]:
            cmd += ["--set", s]
        run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_healthy(self, timeout_s: float = 30.0) -> ServiceProcess:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.alive(), f"{self.name} exited with {self.proc.returncode}:\n{self.log()}"
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except (OSError, urllib.error.URLError):
                pass
            assert time.monotonic() < deadline, f"{self.name} not healthy in {timeout_s} s:\n{self.log()}"
            time.sleep(0.1)

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every sample: (name, labels without service/shard) -> value."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = frozenset((k, v) for k, v in s.labels.items() if k not in ("service", "shard"))
                out[(s.name, labels)] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        """One sample's value (0 when the series does not exist yet)."""
        return self.metrics().get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str) -> float:
        """The sum over all label values of ``name``."""
        return sum(v for (n, _), v in self.metrics().items() if n == name)

    def stop(self, timeout_s: float = 20.0) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@dataclass
class LearnerFleet:
    replay: str  # replay's endpoint
    replay_proc: ServiceProcess
    learner: ServiceProcess


@contextmanager
def learner_fleet(run_dir: Path, replay_sets: list[str]) -> Iterator[LearnerFleet]:
    """Replay, paramserver and learner processes of the CartPole DQN config on free ports, the learner
    sampling batches of 32 from a table of min size 64 with no rate limiter (whatever is inserted is
    sampled at once); ``replay_sets``: replay's own overrides. The learner is healthy when it yields."""
    replay, params = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    sets = [f"network.replay=[{replay}]", f"network.paramserver=[{params}]", "replay.tables.0.min_size=64",
            "replay.tables.0.samples_per_insert=null", "algorithm.batch_size=32"]
    procs = [ServiceProcess("replay", run_dir, [*sets, *replay_sets]), ServiceProcess("paramserver", run_dir, sets)]
    try:
        for p in procs:
            p.wait_healthy(60)
        learner = ServiceProcess("learner", run_dir, sets)
        procs.append(learner)
        learner.wait_healthy(120)
        yield LearnerFleet(replay, procs[0], learner)
    finally:
        for p in reversed(procs):
            p.stop()
