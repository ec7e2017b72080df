"""Every integer on the wire has a range, checked by the decoder before any handler does arithmetic.

The extremes a hostile client sends (0, -1, 2**31, 2**63-1, 2**64-1, -2**63) go to
every integer field of every message type: the decoder takes exactly the values
of the field's documented range and refuses the others with ``bad_field``
naming the field and the range. Over real sockets, replay and a paramserver
shard answer each of them with a reply that is never ``internal``, and keep
serving everyone else afterwards: the heartbeat whose ``env_steps`` of
2**64-1 once broke the registry for every actor is the case in point.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from harness.fuzzing import rows
from harness.paramserver_procs import serving as serving_shard
from harness.replay_helpers import replay_config
from harness.replay_helpers import serving as serving_replay
from rlfleet.common.clients.registry import RegistryClient
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.config.sections import GradientsConfig
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import DTYPES, Message, ProtocolError, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.schema import INT64_MAX, MESSAGES, MessageSpec, range_text
from rlfleet.common.wire.transport import free_tcp_port, make_socket
from rlfleet.services.paramserver.shard import ShardServer

EXTREMES = (0, -1, 1 << 31, (1 << 63) - 1, (1 << 64) - 1, -(1 << 63))

INT_FIELDS = [(spec.name, name) for spec in MESSAGES.values() for name, f in spec.fields.items() if f.kind == "int"]


def base_message(spec: MessageSpec) -> Message:
    """A message of ``spec``'s type that decodes: every field at a value it allows, every required array."""
    values: dict[str, Any] = {"int": None, "str": "main", "bool": False, "map": {}, "list": []}
    body = {name: (f.bounds[0] if f.bounds and f.bounds[0] >= 0 else 1) if f.kind == "int" else values[f.kind]
            for name, f in spec.fields.items()}
    arrays = {name: np.zeros(3, DTYPES[a.dtypes[0]] if a.dtypes else np.float32)
              for name, a in spec.arrays.items() if a.required}
    return Message(spec.name, body, arrays, sender="prober", seq=1)


@pytest.mark.parametrize("mtype,name", INT_FIELDS)
def test_the_decoder_takes_exactly_each_int_fields_range(mtype: str, name: str) -> None:
    spec = MESSAGES[mtype]
    low, high = spec.fields[name].bounds or (0, 0)
    decode(encode(base_message(spec)))
    for value in EXTREMES:
        msg = base_message(spec)
        msg.body[name] = value
        if low <= value <= high:
            assert decode(encode(msg)).body[name] == value
            continue
        with pytest.raises(ProtocolError) as err:
            decode(encode(msg))
        assert err.value.reason == "bad_field"
        assert f"{mtype}.{name} = {value}" in err.value.detail
        assert range_text((low, high)) in err.value.detail


def test_header_seq_takes_0_to_2_64_minus_1() -> None:
    for value in EXTREMES:
        msg = base_message(MESSAGES["info"])
        msg.seq = value
        if value >= 0:
            assert decode(encode(msg)).seq == value
        else:
            with pytest.raises(ProtocolError, match="bad_field"):
                decode(encode(msg))


@pytest.fixture(scope="module")
def shard() -> Iterator[ShardServer]:
    server = ShardServer(ServiceMetrics("paramserver", 0), f"tcp://127.0.0.1:{free_tcp_port()}", 0, 1, 30.0,
                         shm=False, gradients=GradientsConfig(optimizer="sgd", lr=0.1))
    with serving_shard(server):
        WeightsPublisher([server.endpoint]).publish(0, {"w": np.zeros(4, np.float32)}, timeout_s=10)
        yield server


@pytest.fixture(scope="module")
def replay() -> Iterator[str]:
    with serving_replay(replay_config()) as server:
        yield server.endpoint


#: requests that may be held (long poll, barrier, rate-limited sample) when their timeout is long
HELD = {("wait", "timeout_ms"), ("barrier", "timeout_ms"), ("sample", "timeout_ms")}


def probe(endpoint: str, msg: Message, held_ok: bool) -> Message | None:
    """Send ``msg`` over a fresh connection; its reply, or None if it is held (only when ``held_ok``)."""
    sock = make_socket(zmq.DEALER, connect=endpoint)
    try:
        sock.send_multipart(encode(msg))
        if not sock.poll(300 if held_ok else 10_000):
            assert held_ok, f"no reply to {msg.type} {msg.body}"
            return None
        return decode(sock.recv_multipart())
    finally:
        sock.close(linger=0)


def requests(service: str) -> dict[str, Message]:
    """A request of each type ``service`` serves that it answers (not refuses) as it is."""
    if service == "replay":
        return {"insert": Message("insert", {"table": "main", "window_start": 0}, rows(2)),
                "sample": Message("sample", {"table": "main", "batch_size": 1, "timeout_ms": 0})}
    grads = {"w": np.zeros(4, np.float32)}
    publish = Message("publish", {"num_shards": 1, "version": 0}, dict(grads))
    return {"get": Message("get", {"have_version": -1}),
            "wait": Message("wait", {"min_version": 0, "timeout_ms": 0}),
            "heartbeat": Message("heartbeat", {"actor_id": "prober", "role": "actor", "version": -1, "env_steps": 0}),
            "barrier": Message("barrier", {"round": 0, "timeout_ms": 0}),
            "publish": publish,
            "push_gradients": Message("push_gradients", {"version": 0, "num_shards": 1}, dict(grads))}


def probes(service: str, layout: str) -> Iterator[tuple[Message, bool]]:
    for mtype, msg in requests(service).items():
        for name, f in MESSAGES[mtype].fields.items():
            if f.kind != "int":
                continue
            for seq, value in enumerate(EXTREMES, start=1):
                body = {**msg.body, name: value}
                if "num_shards" in body:
                    body["layout"] = layout
                yield (Message(mtype, body, dict(msg.arrays), sender=f"prober-{mtype}-{name}",
                               seq=seq * 10), (mtype, name) in HELD)


def assert_answered_sanely(endpoint: str, service: str, layout: str = "") -> None:
    for msg, held_ok in probes(service, layout):
        reply = probe(endpoint, msg, held_ok)
        if reply is None:
            continue
        assert reply.type != "error" or reply["reason"] != "internal", (msg.type, msg.body, reply.body)


def test_replay_answers_every_int_extreme_and_keeps_serving(replay: str) -> None:
    assert_answered_sanely(replay, "replay")
    good = probe(replay, Message("insert", {"table": "main"}, rows(3), sender="good", seq=1), False)
    assert good is not None and good.type == "ack" and good["stored"] == 3
    batch = probe(replay, Message("sample", {"table": "main", "batch_size": 4, "timeout_ms": 5000},
                                  sender="learner", seq=1), False)
    assert batch is not None and batch.type == "batch"


def test_paramserver_answers_every_int_extreme_and_keeps_serving(shard: ShardServer) -> None:
    layout = shard.weights.default.layout
    assert layout is not None
    assert_answered_sanely(shard.endpoint, "paramserver", layout.fingerprint)
    actor = RegistryClient(shard.endpoint, "after-the-probes")
    assert actor.hello().num_actors >= 1
    assert actor.heartbeat(-1, env_steps=5).fleet_env_steps >= 5


def test_one_heartbeat_cannot_break_the_registry_for_others(shard: ShardServer) -> None:
    hostile = probe(shard.endpoint, Message("heartbeat", {"actor_id": "hostile", "role": "actor", "version": -1,
                                                         "env_steps": (1 << 64) - 1}, sender="hostile", seq=1), False)
    assert hostile is not None and hostile.type == "error" and hostile["reason"] == "bad_field"
    assert "heartbeat.env_steps" in hostile["detail"] and "0 to 2^63-1" in hostile["detail"]
    # In range, but two of them add up past what a welcome can carry: the total saturates.
    big = [RegistryClient(shard.endpoint, f"big-{i}") for i in range(2)]
    for client in big:
        assert client.heartbeat(-1, env_steps=INT64_MAX).fleet_env_steps == INT64_MAX
    others = RegistryClient(shard.endpoint, "bystander")
    assert others.hello().index >= 0
    assert others.heartbeat(-1, env_steps=10).fleet_env_steps == INT64_MAX
    others.goodbye()


def test_every_message_type_with_an_int_field_is_probed() -> None:
    probed = {(m, n) for service in ("replay", "paramserver") for m, n in
              ((msg.type, name) for msg, _ in probes(service, "") for name in msg.body)}
    requests_with_ints = {(m, n) for m, n in INT_FIELDS if m in {*requests("replay"), *requests("paramserver")}}
    assert requests_with_ints <= probed
