"""An oversized message is refused before it is read whole: replay and paramserver set
ZMQ_MAXMSGSIZE on their server sockets to the largest message they accept (512 MiB), so libzmq
drops a peer as a bigger frame's size arrives. Measured from /proc: the service's resident memory
does not grow by the message's size, it stays up, and it answers the next client."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from common.wire.codec import DEFAULT_LIMITS, Message
from common.wire.transport import free_tcp_port, make_socket
from tests.replay_helpers import ask
from tests.service_procs import ServiceProcess

pytestmark = pytest.mark.chaos


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("service", ["replay", "paramserver"])
def test_an_oversized_message_is_refused_without_reading_it(service: str, tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    svc = ServiceProcess(service, tmp_path, [f"network.{service}=[{address}]"]).wait_healthy(60)
    try:
        before = rss_mib(svc.proc.pid)
        big = np.zeros(DEFAULT_LIMITS.max_message_bytes + (88 << 20), np.uint8)  # 600 MiB, one frame
        hostile = make_socket(zmq.DEALER, connect=address, send_timeout_ms=60_000)
        try:
            hostile.send_multipart([b"\x81\xa1v\x01", memoryview(big)], copy=False)
            time.sleep(3.0)
        finally:
            hostile.close(linger=0)
        del big
        peak = rss_mib(svc.proc.pid)
        assert svc.alive(), svc.log()
        assert peak - before < 100, f"RSS {before:.0f} -> {peak:.0f} MiB for a 600 MiB message"
        reply = ask(address, Message(type="info", body={}), sender="after", seq=1)
        assert reply.type == "info_reply", reply
    finally:
        svc.stop()
