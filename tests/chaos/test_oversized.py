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

from harness.replay_helpers import ask
from harness.service_procs import ServiceProcess
from rlfleet.common.wire.codec import DEFAULT_LIMITS, Message
from rlfleet.common.wire.transport import free_tcp_port, make_socket

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


def test_the_message_limit_comes_from_the_config(tmp_path: Path) -> None:
    """network.max_message_mib=8: a 6 MiB message is read (and answered: its header is not a valid
    insert), a 12 MiB one is dropped by ZeroMQ unread (no answer), and the service goes on."""
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    svc = ServiceProcess("replay", tmp_path, [f"network.replay=[{address}]", "network.max_message_mib=8"])
    svc.wait_healthy(60)
    try:
        for mib, answered in ((6, True), (12, False)):
            sock = make_socket(zmq.DEALER, connect=address)
            try:
                sock.send_multipart([b"\x81\xa1v\x01", np.zeros(mib << 20, np.uint8)])
                assert bool(sock.poll(3000)) is answered, f"{mib} MiB"
            finally:
                sock.close(linger=0)
        assert svc.alive(), svc.log()
        assert ask(address, Message(type="info", body={}), sender="after", seq=1).type == "info_reply"
    finally:
        svc.stop()


@pytest.mark.parametrize("service", ["replay", "paramserver"])
def test_a_refused_large_message_is_released_at_once(service: str, tmp_path: Path) -> None:
    """Frames that add up to more than the limit are read, refused with message_too_large, and their
    memory released as soon as the error is sent: it once stayed resident until the next message came
    (the serving loop still held the last frames it had read). Issue 42."""
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    svc = ServiceProcess(service, tmp_path, [f"network.{service}=[{address}]", "network.max_message_mib=64"])
    svc.wait_healthy(60)
    try:
        before = rss_mib(svc.proc.pid)
        part = np.ones(48 << 20, np.uint8)  # each frame under the limit, the two of them over it
        hostile = make_socket(zmq.DEALER, connect=address, send_timeout_ms=60_000)
        try:
            hostile.send_multipart([b"\x81\xa1v\x02", memoryview(part), memoryview(part)], copy=False)
            assert hostile.poll(30_000), "no reply"
            assert b"message_too_large" in hostile.recv_multipart()[0]
        finally:
            hostile.close(linger=0)
        time.sleep(0.5)  # no other message comes meanwhile
        after = rss_mib(svc.proc.pid)
        assert svc.alive(), svc.log()
        assert after - before < 32, f"RSS {before:.0f} -> {after:.0f} MiB after a refused 96 MiB message"
    finally:
        svc.stop()
