"""100,000 malformed messages to each server socket: no server dies, every one is counted once.

The server sockets of the fleet are replay's and the paramserver's ROUTERs
(real processes here, `rlfleet service ...`). The learner, actors and the
evaluator bind no ZeroMQ socket (only their HTTP /metrics), so there is
nothing of theirs to fuzz. How each message is made malformed, and why each
costs exactly one protocol error, is in harness/fuzzing.py.

The fuzzer sends in bursts of BURST and reads the burst's replies before the
next: every malformed message gets exactly one ``error`` reply, so queues
never pass their high-water marks and nothing is dropped on either side.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from harness.fleet_helpers import CONFIGS
from harness.fuzzing import UNCOUNTED, Fuzzer, rows
from harness.service_procs import ServiceProcess
from rlfleet.common import config
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.transport import free_tcp_port, make_socket

MESSAGES = 100_000
BURST = 500


def _fuzz(address: str, fuzzer: Fuzzer, count: int) -> dict[str, int]:
    """Send ``count`` malformed messages; returns the error replies by reason."""
    sock = make_socket(zmq.DEALER, connect=address)
    reasons: dict[str, int] = {}
    try:
        sent = 0
        while sent < count:
            n = min(BURST, count - sent)
            for _ in range(n):
                sock.send_multipart(fuzzer.next())
            sent += n
            for _ in range(n):
                assert sock.poll(10_000), f"no reply after {sent} messages: is the server alive?"
                reply = decode(sock.recv_multipart())
                assert reply.type == "error", reply
                reasons[reply["reason"]] = reasons.get(reply["reason"], 0) + 1
    finally:
        sock.close(linger=0)
    return reasons


def _good_replay_client(cfg: config.Experiment) -> None:
    with InsertClient.from_config(cfg, 0, f"actor-0/{time.monotonic_ns()}") as ic:  # a sender id per client
        ic.insert("main", rows(64), timeout_s=10)
        ic.flush(10)
    with SampleClient.from_config(cfg, "learner", batch_size=16) as sc:
        batch = sc.sample(timeout_s=10)
        assert batch.data["obs"].shape == (16, 4) and batch.table_size == 64


def _good_paramserver_client(cfg: config.Experiment) -> None:
    pub = WeightsPublisher(cfg.network.paramserver, "learner")
    reader = WeightsReader(cfg.network.paramserver, "actor-0")
    try:
        pub.publish(1, {"w": np.full((4, 3), 7, np.float32)}, timeout_s=10)
        got = reader.get(-1, timeout_s=10)
        assert got is not None and got[0] == 1 and float(got[1]["w"][0, 0]) == 7
    finally:
        pub.close()
        reader.close()


@pytest.mark.chaos
@pytest.mark.parametrize("service", ["replay", "paramserver"])
def test_malformed_messages_are_refused_and_counted_once(service: str, tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    sets = [f"network.{service}=[{address}]", "replay.tables.0.min_size=10",
            "replay.tables.0.samples_per_insert=null", "replay.tables.0.columns=first_insert"]
    svc = ServiceProcess(service, tmp_path, sets).wait_healthy()
    try:
        fuzzer = Fuzzer(service, seed=6)
        t0 = time.monotonic()
        reasons = _fuzz(address, fuzzer, MESSAGES)
        elapsed = time.monotonic() - t0
        assert svc.alive(), svc.log()
        assert not UNCOUNTED & set(reasons), reasons
        assert sum(reasons.values()) == MESSAGES
        assert fuzzer.undecodable + fuzzer.handler_refused == MESSAGES
        assert fuzzer.handler_refused > 1000 and len(reasons) >= 10, reasons  # both kinds, many reasons

        # Traffic counters are added after each burst the server reads (common/wire/server.py count()),
        # so the last burst's may land just after its replies: wait for them to settle, then compare.
        undecodable = ("rlfleet_messages_total", frozenset({("type", "undecodable"), ("direction", "in")}))
        deadline = time.monotonic() + 10
        m = svc.metrics()
        while m.get(undecodable) != fuzzer.undecodable and time.monotonic() < deadline:
            time.sleep(0.2)
            m = svc.metrics()
        errors = {dict(labels)["reason"]: int(v) for (n, labels), v in m.items()
                  if n == "rlfleet_protocol_errors_total"}
        assert errors == reasons  # the server counted what it answered, each message once
        assert m[undecodable] == fuzzer.undecodable
        assert "Traceback" not in svc.log()  # no handler failed ("internal")

        cfg = config.load(CONFIGS / "cartpole-dqn.yaml", sets=sets, environ={})
        (_good_replay_client if service == "replay" else _good_paramserver_client)(cfg)
        assert svc.total("rlfleet_protocol_errors_total") == MESSAGES  # the good client cost none
        assert svc.alive()
        print(f"{service}: {MESSAGES} malformed messages in {elapsed:.1f} s, {fuzzer.dropped} mutations "
              f"dropped because they decoded; replies by reason: {dict(sorted(reasons.items()))}")
    finally:
        svc.stop()
