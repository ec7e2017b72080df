"""Secure by default off loopback (issue 43, item 5): replay and paramserver asked to bind beyond loopback
with no CurveZMQ refuse to start, saying how to make keys, unless ``security.insecure: true``. Real
processes (`rlfleet service NAME`), their exit codes and logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.replay_helpers import ask
from harness.service_procs import ServiceProcess
from rlfleet.common.exposure import is_loopback
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.transport import free_tcp_port


@pytest.mark.parametrize("bind,loopback", [
    ("tcp://127.0.0.1:5550", True), ("tcp://127.1.2.3:5550", True), ("tcp://[::1]:5550", True),
    ("tcp://localhost:5550", True), ("tcp://lo:5550", True), ("ipc:///tmp/replay.sock", True),
    ("inproc://replay", True), ("tcp://*:5550", False), ("tcp://0.0.0.0:5550", False),
    ("tcp://10.0.0.5:5550", False), ("tcp://eth0:5550", False), ("tcp://replay:5550", False),
])
def test_what_counts_as_loopback(bind: str, loopback: bool) -> None:
    assert is_loopback(bind) is loopback


def sets(name: str, port: int) -> list[str]:
    return [f"network.{name}=[tcp://127.0.0.1:{port}]"]


@pytest.mark.parametrize("name", ["replay", "paramserver"])
def test_a_server_asked_to_bind_every_interface_without_keys_refuses_to_start(tmp_path: Path, name: str) -> None:
    proc = ServiceProcess(name, tmp_path, [*sets(name, free_tcp_port()), "network.bind_host=*"])
    try:
        assert proc.proc.wait(120) == 1, proc.log()
    finally:
        proc.stop()
    log = proc.log()
    assert f"{name} shard 0 would serve tcp://*:" in log and "no encryption" in log, log
    assert "rlfleet keys" in log and "security.mode=curve" in log and "security.insecure=true" in log, log
    assert "Traceback" not in log


@pytest.mark.parametrize("bind_host", ["*", "127.0.0.1"])
def test_the_explicit_opt_in_and_loopback_serve(tmp_path: Path, bind_host: str) -> None:
    """``security.insecure: true`` binds every interface; loopback needs nothing. Both answer info."""
    port = free_tcp_port()
    opt_in = ["security.insecure=true"] if bind_host == "*" else []
    proc = ServiceProcess("replay", tmp_path, [*sets("replay", port), f"network.bind_host={bind_host}", *opt_in])
    try:
        proc.wait_healthy(120)
        assert ask(f"tcp://127.0.0.1:{port}", Message("info", {})).type == "info_reply"
        assert proc.metrics()  # /metrics still answers over plain HTTP
    finally:
        assert proc.stop() == 0
