"""Long poll, exact-version reads, partial publishes and bad messages (real shard processes)."""

from __future__ import annotations

import threading
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from common.partition import Layout
from common.protocol import Message
from common.server import Client, RemoteError
from common.transport import make_socket
from services.paramserver.client import WeightsPublisher, WeightsReader
from services.paramserver.procs import ShardProcesses


def model(version: int) -> dict[str, np.ndarray]:
    return {"a": np.full((300, 20), version, np.float32), "b": np.full((200, 20), version, np.float32),
            "c": np.full((7,), version, np.float32)}


def raw_publish(address: str, layout: Layout, shard: int, version: int, arrays: dict[str, Any],
                **body: Any) -> Message:
    msg = {"version": version, "num_shards": layout.num_shards, "layout": layout.fingerprint,
           "tensors": layout.to_wire(), **body}
    with Client(address, "raw") as c:
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
        Client(addrs[0], "x").request(Message("get", {"have_version": -1, "version": 2}), 5.0)
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
    with pytest.raises(RemoteError, match="stale_version"):
        pub.publish(start, model(start))
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
    header = {"v": 1, "type": "wait", "sender": "x", "seq": 7, "arrays": [], "body": {"min_version": "soon"}}
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
