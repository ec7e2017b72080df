"""Long poll, exact-version reads, partial publishes and bad messages (real shard processes)."""

from __future__ import annotations

import threading
import time
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from harness.paramserver_procs import ShardProcesses
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.tensor_shards import Layout
from rlfleet.common.wire.codec import PROTOCOL_VERSION, Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.errors import RemoteError
from rlfleet.common.wire.transport import make_socket


def model(version: int) -> dict[str, np.ndarray]:
    return {"a": np.full((300, 20), version, np.float32), "b": np.full((200, 20), version, np.float32),
            "c": np.full((7,), version, np.float32)}


def raw_publish(address: str, layout: Layout, shard: int, version: int, arrays: dict[str, Any],
                **body: Any) -> Message:
    msg = {"version": version, "num_shards": layout.num_shards, "layout": layout.fingerprint,
           "tensors": layout.to_wire(), **body}
    with Connection(address, "raw") as c:
        try:
            return c.request(Message("publish", msg, arrays), 5.0)
        except RemoteError as exc:
            return Message("error", {"reason": exc.reason, "detail": exc.detail})


@pytest.fixture(scope="module")
def shards() -> Any:
    with ShardProcesses(2) as ps:
        yield ps


def test_long_poll_and_exact_versions(shards: ShardProcesses) -> None:
    addrs = shards.addresses
    reader = WeightsReader(addrs, "reader")
    pub = WeightsPublisher(addrs)
    assert reader.get(-1) is None  # nothing published yet
    assert reader.wait(1, 0.3) is None  # not_modified at timeout
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(got=reader.wait(1, 30.0)))
    t.start()
    pub.publish(1, model(1))
    t.join(40)
    assert result["got"][0] == 1 and all((v == 1).all() for v in result["got"][1].values())
    assert reader.get(1) is None
    # Version 2 reaches shard 0 only: readers must stay on 1, the newest every shard holds.
    layout = pub.layout_for(model(2))
    assert raw_publish(addrs[0], layout, 0, 2, layout.slice(model(2), 0)).type == "publish_ack"
    version, tensors = reader.get(-1)
    assert version == 1 and all((v == 1).all() for v in tensors.values())
    assert reader.wait(2, 0.3) is None  # shard 1 never gets 2 in time
    assert raw_publish(addrs[1], layout, 1, 2, layout.slice(model(2), 1)).type == "publish_ack"
    version, tensors = reader.get(1)
    assert version == 2 and all((v == 2).all() for v in tensors.values())
    # Versions 3 and 4 reach shard 0 only: shard 0 holds [4, 3], shard 1 [2, 1]; no common version.
    for v in (3, 4):
        raw_publish(addrs[0], layout, 0, v, layout.slice(model(v), 0))
    assert reader.get(-1) is None
    with pytest.raises(RemoteError, match="version_gone"):
        Connection(addrs[0], "x").request(Message("get", {"have_version": -1, "version": 2}), 5.0)
    pub.publish(5, model(5))
    version, tensors = reader.wait(3, 5.0)
    assert version == 5 and all((v == 5).all() for v in tensors.values())
    reader.close()
    pub.close()


def test_bad_messages_get_errors_and_the_shard_keeps_serving(shards: ShardProcesses) -> None:
    addrs = shards.addresses
    pub = WeightsPublisher(addrs)
    reader = WeightsReader(addrs, "reader2")
    base = reader.get(-1)
    start = 100 if base is None else base[0] + 100
    pub.publish(start, model(start))
    pub.publish(start, model(start))  # a retry of the newest version is acked again
    with pytest.raises(RemoteError, match="stale_version"):
        pub.publish(start, model(start + 7))  # same version, other contents: not a retry
    with pytest.raises(RemoteError, match="stale_version"):
        pub.publish(start - 1, model(start - 1))
    wrong = model(start + 1)
    wrong["a"] = np.zeros((3, 3), np.float32)  # another model: a different layout
    with pytest.raises(RemoteError, match="layout_mismatch"):
        pub.publish(start + 1, wrong)
    layout = pub.layout_for(model(start))
    other = 1 - [i for i in range(2) if "a" in layout.shards[i]][0]
    # A tensor sent to the wrong shard, a wrong shape under the right fingerprint, a wrong shard count.
    assert raw_publish(addrs[other], layout, other, start + 1, {"a": model(0)["a"]})["reason"] == "layout_mismatch"
    bad_shape = {n: np.zeros((1,), np.float32) for n in layout.shards[other]}
    assert raw_publish(addrs[other], layout, other, start + 1, bad_shape)["reason"] == "layout_mismatch"
    assert raw_publish(addrs[0], layout, 0, start + 1, layout.slice(model(1), 0),
                       num_shards=3)["reason"] == "layout_mismatch"
    # Garbage on the wire: undecodable frames, an unknown type, a field of the wrong kind.
    sock = make_socket(zmq.DEALER, connect=addrs[0])
    sock.send_multipart([b"\xc1garbage"])
    header = {"v": PROTOCOL_VERSION, "type": "wait", "sender": "x", "seq": 7, "arrays": [],
              "body": {"min_version": "soon"}}
    sock.send_multipart([msgpack.packb(header)])
    sock.send_multipart([msgpack.packb({**header, "type": "frobnicate"})])
    sock.send_multipart([msgpack.packb({**header, "type": "hello", "body": {"actor_id": "x", "role": "ghost"}})])
    reasons = []
    for _ in range(4):
        assert sock.poll(5000)
        reply = msgpack.unpackb(sock.recv_multipart()[0])
        assert reply["type"] == "error"
        reasons.append(reply["body"]["reason"])
    sock.close(0)
    assert reasons == ["bad_msgpack", "bad_field", "unknown_type", "bad_role"]
    # Still serving, still consistent.
    version, tensors = reader.get(-1)
    assert version == start and all((v == start).all() for v in tensors.values())
    pub.publish(start + 2, model(start + 2))
    assert reader.wait(start + 1, 5.0)[0] == start + 2
    reader.close()
    pub.close()


def info(address: str) -> dict[str, Any]:
    with Connection(address, "probe") as c:
        return dict(c.request(Message("info"), 5.0)["stats"])


def wait_until(cond, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_publish_retry_is_acked_and_readers_see_the_version_once(shards: ShardProcesses) -> None:
    addrs = shards.addresses
    pub = WeightsPublisher(addrs)
    reader = WeightsReader(addrs, "retry-reader")
    base = reader.get(-1)
    v = 0 if base is None else base[0] + 1000
    pub.publish(v, model(v))
    # The learner timed out waiting for an ack (the shards had stored it) and publishes v again.
    pub.publish(v, model(v))
    # A first attempt of v + 1 reached shard 0 only; the retry stores it on shard 1 and shard 0 acks again.
    layout = pub.layout_for(model(v + 1))
    assert raw_publish(addrs[0], layout, 0, v + 1, layout.slice(model(v + 1), 0)).type == "publish_ack"
    assert reader.get(-1)[0] == v  # shard 1 has only v so far
    pub.publish(v + 1, model(v + 1))
    version, tensors = reader.wait(v + 1, 10.0)
    assert version == v + 1 and all((t == v + 1).all() for t in tensors.values())
    assert [info(a)["versions"] for a in addrs] == [[v + 1, v], [v + 1, v]]  # stored once
    # A reader parked for v + 2 is not woken by yet another retry of v + 1: it sees v + 1 once.
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(got=reader.wait(v + 2, 3.0)))
    t.start()
    wait_until(lambda: all(info(a)["waits_parked"] >= 1 for a in addrs))
    pub.publish(v + 1, model(v + 1))
    t.join(20)
    assert result == {"got": None}
    # Not retries: an older version, the same version with other contents or another layout.
    with pytest.raises(RemoteError, match="stale_version"):
        pub.publish(v, model(v))
    with pytest.raises(RemoteError, match="stale_version"):
        pub.publish(v + 1, model(v + 5))
    other = Layout.from_specs([("z", "float32", (4,))], 2)
    reply = raw_publish(addrs[0], other, 0, v + 1, other.slice({"z": np.zeros(4, np.float32)}, 0))
    assert reply["reason"] == "stale_version"
    assert [info(a)["versions"] for a in addrs] == [[v + 1, v], [v + 1, v]]
    reader.close()
    pub.close()


def test_a_new_wait_ends_the_earlier_one_even_when_answered_at_once(shards: ShardProcesses) -> None:
    addrs = shards.addresses
    pub = WeightsPublisher(addrs)
    reader = WeightsReader(addrs, "x")
    base = reader.get(-1)
    v = 0 if base is None else base[0] + 1000
    pub.publish(v, model(v))
    with Connection(addrs[0], "same-dealer") as c:
        first = c.send(Message("wait", {"min_version": v + 1, "timeout_ms": 60_000}))
        wait_until(lambda: info(addrs[0])["waits_parked"] >= 1)
        second = c.send(Message("wait", {"min_version": v, "timeout_ms": 60_000}))  # answered at once
        replies = [c.recv(10.0), c.recv(10.0)]
    assert [(r.type, r["ref_seq"]) for r in replies] == [("not_modified", first), ("weights", second)]
    assert replies[1]["version"] == v
    wait_until(lambda: info(addrs[0])["waits_parked"] == 0)
    reader.close()
    pub.close()


def test_a_request_lost_with_a_restarted_shard_is_sent_again_at_once() -> None:
    """A shard that dies with a reader's get queued (never answered) and comes back on its address:
    the reader sees the new handshake and asks again, answered then, not at its timeout (120 s here:
    a reader that waited it out fails the join's generous 60 s)."""
    from harness.paramserver_procs import serving
    from rlfleet.common.metrics import ServiceMetrics
    from rlfleet.common.wire.transport import free_tcp_port
    from rlfleet.services.paramserver.shard import ShardServer

    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    first = ShardServer(ServiceMetrics("paramserver"), address, 0, 1, 5.0, shm=False)  # bound, not serving
    reader = WeightsReader([address], "actor-0", shm=False)
    result: dict[str, Any] = {}

    def get() -> None:
        try:
            result["weights"] = reader.get(-1, timeout_s=120.0)
        except Exception as exc:  # noqa: BLE001 (reported below)
            result["error"] = exc

    thread = threading.Thread(target=get, daemon=True)
    thread.start()
    assert first.sock.poll(30_000)  # the get sits in the first shard's queue...
    first.close()  # ... and dies with it
    try:
        deadline = time.monotonic() + 30
        while True:  # the old socket releases the port in ZeroMQ's I/O thread, soon after close
            try:
                second = ShardServer(ServiceMetrics("paramserver"), address, 0, 1, 5.0, shm=False)
                break
            except zmq.ZMQError:
                assert time.monotonic() < deadline, f"{address} still in use"
                time.sleep(0.05)
        with serving(second):
            thread.join(60)
            assert not thread.is_alive(), "the get was not asked again of the restarted shard"
    finally:
        reader.close()
    assert "error" not in result, result
    assert result["weights"] is None  # nothing published yet: not_modified
