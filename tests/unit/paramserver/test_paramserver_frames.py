"""Weights served as payload frames (readers on other hosts) go without a copy, and stay intact (real sockets).

A shard keeps a frames publish as read-only views of the received frames and
sends those views to every reader without copying them (pyzmq holds each
buffer until ZeroMQ has sent it); arrays of a shared-memory file are copied,
since the file is reused for a later version once its version is dropped.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import zmq

from harness.paramserver_procs import serving
from rlfleet.common import weights_shm as shmlib
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.server import Peer
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.paramserver.shard import ShardServer

SHAPES = {"a.w": (300, 200), "a.b": (200,), "b.w": (64, 7), "steps": (1,)}  # big, small and tiny tensors


def model(version: int) -> dict[str, np.ndarray]:
    return {n: np.full(s, version, np.float32) for n, s in SHAPES.items()}


class RecordingShard(ShardServer):
    """Records whether each weights reply went with or without a copy."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.weights_copy: list[bool] = []

    def send_frames(self, peer: Peer, frames: list[Any], mtype: str, *, copy: bool = True) -> bool:
        if mtype == "weights":
            self.weights_copy.append(copy)
        return super().send_frames(peer, frames, mtype, copy=copy)


def shard(address: str, shm: bool = True) -> RecordingShard:
    return RecordingShard(ServiceMetrics("paramserver"), address, 0, 1, 5.0, shm=shm)


def test_frames_publish_goes_to_readers_without_copy_and_stays_intact() -> None:
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    with serving(shard(address)) as server:
        pub = WeightsPublisher([address], "learner", shm=False)
        readers = [WeightsReader([address], f"actor-{i}", shm=False) for i in range(4)]
        try:
            kept: list[tuple[int, dict[str, np.ndarray]]] = []
            for version in range(1, 6):
                pub.publish(version, model(version), timeout_s=10)
                for r in readers:
                    got = r.wait(version, 10.0)
                    assert got is not None and got[0] == version
                    kept.append(got)
            assert server.weights.default.held[0].frames, "a frames publish is held as views of its frames"
            assert server.weights_copy and not any(server.weights_copy), server.weights_copy
            # versions 1..3 are long dropped by the shard: what readers hold of them is intact
            for version, tensors in kept:
                assert set(tensors) == set(SHAPES)
                for name, arr in tensors.items():
                    assert arr.shape == SHAPES[name] and not arr.flags.writeable
                    assert float(arr.min()) == float(arr.max()) == version, (version, name)
        finally:
            pub.close()
            for r in readers:
                r.close()


@pytest.mark.skipif(not shmlib.available(), reason="no usable /dev/shm")
def test_shared_memory_publish_is_copied_into_frames_replies() -> None:
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    with serving(shard(address)) as server:
        pub = WeightsPublisher([address], "learner", shm=True)
        reader = WeightsReader([address], "actor-0", shm=False)  # a reader on another host: frames
        try:
            for version in range(1, 5):  # the shard hands dropped versions' files back to the publisher
                pub.publish(version, model(version), timeout_s=10)
                got = reader.wait(version, 10.0)
                assert got is not None and got[0] == version
                assert all(float(a.min()) == float(a.max()) == version for a in got[1].values())
            assert server.shm.enabled and server.weights.default.held[0].frames is False
            assert server.weights_copy and all(server.weights_copy), server.weights_copy
        finally:
            pub.close()
            reader.close()


def test_gradient_versions_are_copied() -> None:
    """Arrays the shard computed (a gradient push) are its own, not received frames: copied."""
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    with serving(shard(address, shm=False)) as server:
        pub = WeightsPublisher([address], "learner", shm=False)
        reader = WeightsReader([address], "actor-0", shm=False)
        try:
            pub.publish(0, model(0), timeout_s=10)
            layout = pub.layout_for(model(0))
            grads = {n: np.ones(s, np.float32) for n, s in SHAPES.items()}
            body = {"version": 0, "num_shards": 1, "layout": layout.fingerprint}
            ack = pub.shards.gather({0: Message("push_gradients", body, grads)}, time.monotonic() + 10)[0]
            assert ack.type == "gradients_ack" and ack["applied"], ack.body
            got = reader.wait(1, 10.0)
            assert got is not None and got[0] == 1
            assert server.weights.default.held[0].frames is False
            assert server.weights_copy[-1] is True
        finally:
            pub.close()
            reader.close()


def test_reader_that_never_reads_does_not_hold_up_the_others() -> None:
    """A peer that parks a wait and never reads its replies: publishes and other readers go on."""
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    big = {"w": (1024, 1024)}  # 4 MB a version
    ctx: zmq.Context[Any] = zmq.Context.instance()
    slow = ctx.socket(zmq.DEALER)
    slow.setsockopt(zmq.LINGER, 0)
    slow.setsockopt(zmq.RCVHWM, 1)
    slow.setsockopt(zmq.RCVBUF, 4096)
    with serving(shard(address, shm=False)):
        slow.connect(address)
        pub = WeightsPublisher([address], "learner", shm=False)
        reader = WeightsReader([address], "actor-fast", shm=False)
        seen: list[int] = []
        try:
            def park(version: int) -> None:
                msg = Message("wait", {"min_version": version, "timeout_ms": 60_000})
                msg.sender, msg.seq = "actor-slow", version + 1
                slow.send_multipart(encode(msg))

            started = time.monotonic()
            for version in range(1, 13):
                park(version)  # each wait ends the last one: a reply (or more) queued to a peer that never reads
                pub.publish(version, {n: np.full(s, version, np.float32) for n, s in big.items()}, timeout_s=10)
                got = reader.wait(version, 10.0)
                assert got is not None and got[0] == version
                assert float(got[1]["w"][-1, -1]) == version
                seen.append(version)
            assert time.monotonic() - started < 30
        finally:
            pub.close()
            reader.close()
            slow.close()
    assert seen == list(range(1, 13))
