"""Named models next to the default one (a world model beside the policy), on real shard processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from harness.paramserver_procs import ShardProcesses
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.tensor_shards import Layout
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.common.wire.schema import DEFAULT_MODEL
from rlfleet.common.wire.transport import free_tcp_port, make_socket
from rlfleet.services.paramserver.weights_store import MAX_NAMED_MODELS


def policy(version: int) -> dict[str, np.ndarray]:
    return {"a": np.full((300, 20), version, np.float32), "b": np.full((200, 20), version, np.float32),
            "c": np.full((7,), version, np.float32)}


def world(version: int, hidden: int = 16) -> dict[str, np.ndarray]:
    return {"dyn.w": np.full((hidden, 5), 100 + version, np.float32), "dyn.b": np.full((5,), -version, np.float64),
            "rew.w": np.full((hidden, 1), 0.5 * version, np.float32)}


def request(address: str, mtype: str, body: dict[str, Any], arrays: dict[str, Any] | None = None) -> Message:
    """One request; an ``error`` reply comes back as a Message (not raised)."""
    with Connection(address, "raw") as c:
        try:
            return c.request(Message(mtype, body, arrays or {}), 5.0)
        except RemoteError as exc:
            return Message("error", {"reason": exc.reason, "detail": exc.detail})


def publish_body(layout: Layout, version: int, **body: Any) -> dict[str, Any]:
    return {"version": version, "num_shards": layout.num_shards, "layout": layout.fingerprint,
            "tensors": layout.to_wire(), **body}


def stats(address: str) -> dict[str, Any]:
    with Connection(address, "stats") as c:
        return c.request(Message("info"), 5.0)["stats"]


def same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    return got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) and got[k].dtype == want[k].dtype
                                             for k in want)


@pytest.fixture(params=[1, 2], ids=["1shard", "2shards"])
def shards(request: pytest.FixtureRequest) -> Iterator[ShardProcesses]:
    with ShardProcesses(request.param) as ps:
        yield ps


def test_two_models_have_their_own_tensors_and_versions(shards: ShardProcesses) -> None:
    addrs = shards.addresses
    pub, wpub = WeightsPublisher(addrs), WeightsPublisher(addrs, "modeler", model="world")
    reader, wreader = WeightsReader(addrs, "actor"), WeightsReader(addrs, "planner", model="world")
    try:
        assert wreader.get(-1) is None and wreader.wait(0, 0.2) is None  # nothing of it yet
        for v in (4, 5):
            pub.publish(v, policy(v))
        assert wreader.get(-1) is None  # the policy is not the world model
        for v in (1, 2, 3):  # its own version numbers: below the policy's is fine
            wpub.publish(v, world(v))
        version, tensors = reader.get(-1)
        assert version == 5 and same(tensors, policy(5))
        version, tensors = wreader.get(-1)
        assert version == 3 and same(tensors, world(3))
        version, tensors = wreader.wait(3, 5.0)
        assert version == 3 and same(tensors, world(3))
        assert wreader.get(3) is None and reader.get(5) is None
        for address in addrs:
            s = stats(address)
            assert s["versions"] == [5, 4] and s["models"] == {DEFAULT_MODEL: [5, 4], "world": [3, 2]}
            assert s["layout"] == pub.layout_for(policy(5)).fingerprint
        # exact versions per model: the world model keeps 3 and 2, the policy 5 and 4
        with Connection(addrs[0], "x") as c:
            got = c.request(Message("get", {"have_version": -1, "version": 2, "model": "world"}), 5.0)
            assert got.type == "weights" and got["version"] == 2 and got["versions"] == [3, 2]
            with pytest.raises(RemoteError, match="version_gone"):
                c.request(Message("get", {"have_version": -1, "version": 2}), 5.0)
        # stale versions and retries are per model
        with pytest.raises(RemoteError, match="stale_version"):
            wpub.publish(2, world(2))
        wpub.publish(3, world(3))  # a retry of its newest: acked again
        pub.publish(6, policy(6))
        assert reader.get(5)[0] == 6 and wreader.get(-1)[0] == 3
    finally:
        for c in (pub, wpub, reader, wreader):
            c.close()


def test_a_long_poll_is_woken_only_by_its_own_model(shards: ShardProcesses) -> None:
    addrs = shards.addresses
    pub, wpub = WeightsPublisher(addrs), WeightsPublisher(addrs, "modeler", model="world")
    reader, wreader = WeightsReader(addrs, "actor"), WeightsReader(addrs, "planner", model="world")
    try:
        got: dict[str, Any] = {}
        waiter = threading.Thread(target=lambda: got.update(world=wreader.wait(1, 20.0)))
        waiter.start()
        time.sleep(0.3)
        pub.publish(1, policy(1))
        pub.publish(2, policy(2))
        time.sleep(0.5)
        assert waiter.is_alive() and "world" not in got  # the policy's versions do not wake it
        wpub.publish(1, world(1))
        waiter.join(10)
        assert not waiter.is_alive() and got["world"][0] == 1 and same(got["world"][1], world(1))
        # and the other way round: a publish of the world model does not wake a policy reader
        waiter = threading.Thread(target=lambda: got.update(policy=reader.wait(3, 20.0)))
        waiter.start()
        time.sleep(0.3)
        wpub.publish(2, world(2))
        wpub.publish(3, world(3))
        time.sleep(0.5)
        assert waiter.is_alive() and "policy" not in got
        pub.publish(3, policy(3))
        waiter.join(10)
        assert not waiter.is_alive() and got["policy"][0] == 3 and same(got["policy"][1], policy(3))
    finally:
        for c in (pub, wpub, reader, wreader):
            c.close()


def test_bad_names_and_too_many_models_are_refused_and_the_shard_goes_on() -> None:
    with ShardProcesses(1) as shards:
        address = shards.addresses[0]
        layout = Layout.from_specs([("w", "float32", (3,))], 1)
        w = {"w": np.zeros(3, np.float32)}
        for bad in ("World", "1world", "world-model", "x" * 33, ""):
            for mtype, body, arrays in (("publish", publish_body(layout, 1, model=bad), w),
                                        ("get", {"have_version": -1, "model": bad}, None),
                                        ("wait", {"min_version": 0, "timeout_ms": 100, "model": bad}, None)):
                reply = request(address, mtype, body, arrays)
                assert reply.type == "error" and reply["reason"] == "bad_field", (mtype, bad, reply.body)
                assert repr(bad) in reply["detail"] and "[a-z][a-z0-9_]{0,31}" in reply["detail"]
        reply = request(address, "get", {"have_version": -1, "model": 7})  # not a string: the decoder's refusal
        assert reply.type == "error" and reply["reason"] == "bad_field" and "model" in reply["detail"]
        for i in range(MAX_NAMED_MODELS):
            assert request(address, "publish", publish_body(layout, 1, model=f"m{i}"), w).type == "publish_ack"
        reply = request(address, "publish", publish_body(layout, 1, model="one_too_many"), w)
        assert reply.type == "error" and reply["reason"] == "bad_field"
        assert "'one_too_many'" in reply["detail"] and f"at most {MAX_NAMED_MODELS}" in reply["detail"]
        # the models it holds still take new versions, the default model still works, and nothing else changed
        assert request(address, "publish", publish_body(layout, 2, model="m0"), w).type == "publish_ack"
        assert request(address, "publish", publish_body(layout, 1), w).type == "publish_ack"
        models = stats(address)["models"]
        assert models == {DEFAULT_MODEL: [1], "m0": [2, 1], **{f"m{i}": [1] for i in range(1, MAX_NAMED_MODELS)}}
        assert request(address, "get", {"have_version": -1, "model": "one_too_many"})["versions"] == []
        assert shards.procs[0].poll() is None
    with pytest.raises(ValueError, match="World"):
        WeightsReader([address], "planner", model="World")
    with pytest.raises(ValueError, match="allowed"):
        WeightsPublisher([address], "modeler", model="world model")


def test_a_named_model_keeps_its_first_layout() -> None:
    with ShardProcesses(2) as shards:
        addrs = shards.addresses
        wpub = WeightsPublisher(addrs, "modeler", model="world")
        other = WeightsPublisher(addrs, "modeler2", model="world")
        try:
            wpub.publish(1, world(1))
            with pytest.raises(RemoteError, match="layout_mismatch") as exc:
                other.publish(2, world(2, hidden=32))  # another shape under the same name
            assert "'world'" in exc.value.detail
            # the same tensors are fine as another named model, and as the default model
            WeightsPublisher(addrs, "modeler3", model="world_big").publish(1, world(1, hidden=32))
            WeightsPublisher(addrs, "learner").publish(1, world(1, hidden=32))
            wpub.publish(2, world(2))
            reader = WeightsReader(addrs, "planner", model="world")
            version, tensors = reader.get(-1)
            assert version == 2 and same(tensors, world(2))
            reader.close()
        finally:
            wpub.close()
            other.close()


def test_named_models_use_frames_only() -> None:
    with ShardProcesses(1) as shards:
        address = shards.addresses[0]
        assert stats(address)["shm"] is True  # the shard would serve the default model through /dev/shm
        wpub = WeightsPublisher([address], "modeler", model="world")
        wreader = WeightsReader([address], "planner", model="world")
        try:
            assert wpub.use_shm == [False] and wpub.writer is None and wreader.use_shm == [False]
            wpub.publish(1, world(1))
            layout = wpub.layout_for(world(1))
            desc = {"path": "/dev/shm/rlfleet-ps-0-nothing-pub0", "arrays": []}
            reply = request(address, "publish", publish_body(layout, 2, model="world", shm=desc))
            assert reply.type == "error" and reply["reason"] == "shm_unavailable" and "'world'" in reply["detail"]
            got = request(address, "get", {"have_version": -1, "model": "world", "shm": True})
            assert got.type == "weights" and "shm" not in got.body and same(got.arrays, world(1))
            got = request(address, "wait", {"min_version": 1, "timeout_ms": 100, "model": "world", "shm": True})
            assert got.type == "weights" and "shm" not in got.body and same(got.arrays, world(1))
            assert wreader.get(-1)[0] == 1
        finally:
            wpub.close()
            wreader.close()


def test_default_clients_send_what_they_sent_before() -> None:
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    router = make_socket(zmq.ROUTER, bind=endpoint)  # stands in for a shard: reads the requests as sent
    try:
        bodies = {}
        for model in (None, DEFAULT_MODEL, "world"):
            reader = WeightsReader([endpoint], "reader", model=model, timeout_s=0.5, shm=False)
            threading.Thread(target=lambda r=reader: _quietly(r.get, -1), daemon=True).start()
            assert router.poll(5_000)
            bodies[model] = decode(router.recv_multipart()[1:]).body
            time.sleep(0.6)
            reader.close()
        assert bodies[None] == bodies[DEFAULT_MODEL] == {"have_version": -1}
        assert bodies["world"] == {"have_version": -1, "model": "world"}
    finally:
        router.close(linger=0)


def _quietly(call: Any, *args: Any) -> None:
    try:
        call(*args)
    except Exception:  # the stand-in never answers: the call times out
        pass


def test_a_wait_for_a_named_model_does_not_count_for_the_barrier() -> None:
    with ShardProcesses(1) as shards:
        addrs = shards.addresses
        with Connection(addrs[0], "actor0") as c:
            assert c.request(Message("hello", {"actor_id": "actor0", "role": "actor"}), 5.0)["num_actors"] == 1
        wreader, reader = WeightsReader(addrs, "actor0", model="world"), WeightsReader(addrs, "actor0")
        pub = WeightsPublisher(addrs)
        waits = [threading.Thread(target=_quietly, args=(wreader.wait, 2, 30.0), daemon=True),
                 threading.Thread(target=_quietly, args=(reader.wait, 2, 30.0), daemon=True)]
        try:
            waits[0].start()
            deadline = time.monotonic() + 30
            while stats(addrs[0])["waits_parked"] < 1:  # the world model's wait is parked on the shard...
                assert time.monotonic() < deadline, "the world model's wait never reached the shard"
                time.sleep(0.02)
            with pytest.raises(CommTimeout, match="0 of 1 live actors"):  # ...and counts for nothing
                pub.barrier(1, 0.5)  # actor0's only wait is for the world model
            waits[1].start()
            assert pub.barrier(1, 5.0) == 1
            wpub = WeightsPublisher(addrs, "modeler", model="world")
            pub.publish(2, policy(2))  # each wait answered by its own model's version 2
            wpub.publish(2, world(2))
            wpub.close()
            for t in waits:
                t.join(10)
                assert not t.is_alive()
        finally:
            for client in (wreader, reader, pub):
                client.close()
