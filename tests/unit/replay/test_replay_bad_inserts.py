"""Bad inserts get an error reply naming the problem; the server keeps serving the next good client."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from harness.replay_helpers import ask, replay_config, serving, transitions
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.wire.codec import PROTOCOL_VERSION, Limits, Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.transport import make_socket


def request(sock: zmq.Socket[Any], frames: list[Any], timeout_ms: int = 5000) -> Message:
    sock.send_multipart(frames)
    assert sock.poll(timeout_ms), "no reply"
    return decode(sock.recv_multipart())


def insert_frames(arrays: dict[str, np.ndarray], seq: int, table: str = "main", packed: bool = False) -> list[Any]:
    return encode(Message("insert", {"table": table}, arrays, sender="bad", seq=seq), packed=packed)


def good(n: int = 4) -> dict[str, np.ndarray]:
    return transitions(0, 0, n)


BAD: list[tuple[str, Any, str, str]] = [
    ("missing column", lambda: {k: v for k, v in good().items() if k != "reward"}, "schema_mismatch", "'reward'"),
    ("wrong dtype", lambda: {**good(), "action": good()["action"].astype(np.int32)}, "schema_mismatch", "'action'"),
    ("wrong shape", lambda: {**good(), "obs": np.zeros((4, 5), np.float32)}, "schema_mismatch", "'obs'"),
    ("extra column", lambda: {**good(), "extra": np.zeros(4)}, "schema_mismatch", "'extra'"),
    ("ragged batch", lambda: {**good(), "reward": np.zeros(3, np.float32)}, "bad_batch", "'reward'"),
    ("scalar column", lambda: {**good(), "reward": np.float32(1.0).reshape(())}, "bad_batch", "'reward'"),
    ("oversize batch", lambda: transitions(0, 0, 200), "batch_too_large", "200 items"),
    ("reserved name", lambda: {**good(), "key": np.zeros(4, np.uint64)}, "reserved_column", "'key'"),
    ("nan priority", lambda: {**good(), "priority": np.full(4, np.nan)}, "bad_priority", "finite"),
    ("short priority", lambda: {**good(), "priority": np.ones(3)}, "bad_priority", "[4]"),
]


@pytest.mark.parametrize("packed", [False, True])
def test_bad_inserts_get_errors_and_the_server_goes_on(packed: bool) -> None:
    cfg = replay_config(capacity=100)
    with serving(cfg, limits=Limits(max_message_bytes=1 << 20)) as server:
        sock = make_socket(zmq.DEALER, connect=server.endpoint)
        try:
            ok = request(sock, insert_frames(good(), 1, packed=packed))
            assert ok.type == "ack" and ok["stored"] == 4
            # the same layout as "nan priority" below passed once (a packed layout is then known):
            # the priorities of every insert are still checked
            ok = request(sock, insert_frames({**good(), "priority": np.ones(4)}, 2, packed=packed))
            assert ok.type == "ack" and ok["stored"] == 4
            seq = 3
            for name, make, reason, word in BAD:
                reply = request(sock, insert_frames(make(), seq, packed=packed))
                assert reply.type == "error", name
                assert (reply["reason"], reply["ref_seq"]) == (reason, seq), (name, reply.body)
                assert word in reply["detail"], (name, reply["detail"])
                seq += 1
            reply = request(sock, insert_frames(good(), seq, table="other", packed=packed))
            assert reply["reason"] == "unknown_table"
            # oversize message, frames that add up to more than the limit: refused by the decoder before
            # anything is built (packed, they are one frame: the case below)
            if not packed:
                wide = np.zeros((4, 40_000), np.float32)  # 640 KB a frame, under the 1 MiB limit alone
                big = {**good(), "obs": wide, "next_obs": wide}
                assert request(sock, insert_frames(big, 99, packed=packed))["reason"] == "message_too_large"
            # one frame larger than the limit: libzmq drops the connection before reading it (ZMQ_MAXMSGSIZE)
            hostile = make_socket(zmq.DEALER, connect=server.endpoint)
            try:
                hostile.send_multipart(insert_frames({**good(), "obs": np.zeros((4, 1 << 17), np.float32)}, 1,
                                                     packed=packed))
                assert not hostile.poll(1000), "an oversized frame was answered: it was read"
            finally:
                hostile.close(linger=0)
            # garbage frames
            assert request(sock, [b"\x00garbage"])["reason"] in ("bad_msgpack", "bad_header")
            bare = msgpack.packb({"v": PROTOCOL_VERSION, "type": "insert"})
            assert request(sock, [bare])["reason"] == "missing_field"
            header = msgpack.packb({"v": PROTOCOL_VERSION, "type": "insert", "sender": "x", "seq": 5,
                                    "body": {"table": "main"}, "arrays": [["obs", "float32", [4, 4]]]})
            assert request(sock, [header, b"short"])["reason"] == "frame_length_mismatch"
            assert request(sock, [msgpack.packb({**msgpack.unpackb(header), "v": 7})])["reason"] == \
                "version_mismatch"
        finally:
            sock.close(linger=0)
        assert server.tables["main"].size == 8  # nothing bad was stored
        errors = server.metrics.protocol_errors
        assert errors.labels("schema_mismatch")._value.get() == 4
        assert errors.labels("bad_msgpack")._value.get() + errors.labels("bad_header")._value.get() == 1
        # the next good client is served
        with InsertClient(server.endpoint, "good") as ic:
            ic.insert("main", transitions(1, 0, 8))
            ic.flush(5)
            assert ic.acked == 1
        assert server.tables["main"].size == 16


def test_insert_client_raises_the_refusal_and_continues() -> None:
    with serving(replay_config(capacity=100)) as server:
        with InsertClient(server.endpoint, "a") as ic:
            ic.insert("main", good())
            ic.insert("main", {**good(), "obs": np.zeros((4, 2), np.float32)})
            with pytest.raises(Exception) as e:
                ic.flush(5)
            assert getattr(e.value, "reason", "") == "schema_mismatch"
            # the refusal is sent at once, the good insert's ack at the end of the burst: it may come after
            ic.flush(5)
            assert ic.unacked == 0  # the refused insert left the window
            ic.insert("main", good())
            ic.flush(5)
        assert server.tables["main"].size == 8


def test_a_duplicate_with_bad_content_is_refused_not_acked() -> None:
    """A resend of an already stored (sender, seq) is checked as the first send was: invalid content
    gets the error that names it, not a duplicate ack (which would tell its sender all is well)."""
    with serving(replay_config(capacity=100)) as server:
        sock = make_socket(zmq.DEALER, connect=server.endpoint)
        try:
            assert request(sock, insert_frames(good(), 1))["stored"] == 4
            assert request(sock, insert_frames(good(), 1))["duplicate"] is True  # a true resend
            for name, make, reason, word in BAD:
                reply = request(sock, insert_frames(make(), 1))
                assert reply.type == "error" and reply["reason"] == reason, (name, reply.body)
                assert word in reply["detail"], (name, reply["detail"])
        finally:
            sock.close(linger=0)
        assert server.tables["main"].size == 4


def test_error_ref_seq_is_the_seq_whenever_the_header_had_one() -> None:
    """A client with several requests out can tell which one failed, for decoder errors too."""
    with serving(replay_config(capacity=100), limits=Limits(max_message_bytes=1 << 20)) as server:
        sock = make_socket(zmq.DEALER, connect=server.endpoint)
        try:
            header = {"v": PROTOCOL_VERSION, "type": "insert", "sender": "x", "seq": 41, "body": {"table": "main"},
                      "arrays": [["obs", "float32", [4, 4]]]}
            cases = [
                ([msgpack.packb(header), b"short"], "frame_length_mismatch", 41),
                ([msgpack.packb({**header, "v": 7, "seq": 42})], "version_mismatch", 42),
                ([msgpack.packb({**header, "type": "nope", "seq": 43})], "unknown_type", 43),
                ([msgpack.packb({**header, "seq": 44}), b"x" * (1 << 19), b"y" * (1 << 19)], "message_too_large", 44),
                ([msgpack.packb({**header, "seq": -5})], "bad_field", -1),  # out of range: not a seq
                ([msgpack.packb({**header, "v": "1", "seq": 45})], "version_mismatch", 45),  # v not an int
                ([msgpack.packb({k: v for k, v in header.items() if k != "v"} | {"seq": 46})], "missing_field", 46),
                ([b"\x00garbage"], "bad_msgpack", -1),
                ([msgpack.packb({**header, "body": {"x": msgpack.ExtType(5, b"")}})], "bad_msgpack", -1),  # no ext
            ]
            for frames, reason, ref in cases:
                reply = request(sock, frames)
                assert (reply["reason"], reply["ref_seq"]) == (reason, ref), reply.body
        finally:
            sock.close(linger=0)


def test_info_shows_each_tables_schema() -> None:
    """What an insert must match is visible before sending one: null until the first insert fixes it."""
    with serving(replay_config(capacity=100)) as server:
        before = ask(server.endpoint, Message("info", {}))
        assert before["stats"]["tables"]["main"]["schema"] is None
        assert ask(server.endpoint, Message("insert", {"table": "main"}, good()), seq=2)["stored"] == 4
        schema = ask(server.endpoint, Message("info", {}), seq=3)["stats"]["tables"]["main"]["schema"]
        assert schema["obs"] == "float32[4]" and schema["action"] == "int64[]", schema
        assert set(schema) == set(good())
