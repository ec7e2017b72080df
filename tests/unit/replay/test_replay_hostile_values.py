"""Inserts a hostile client writes from docs/protocol.md alone, refused before anything is stored (real sockets)."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest
import zmq

from common.wire.codec import Message, encode
from common.wire.decoder import decode
from common.wire.transport import make_socket
from harness.fuzzing import rows
from harness.replay_helpers import replay_config, serving


@pytest.fixture
def replay() -> Iterator[str]:
    with serving(replay_config()) as server:
        yield server.endpoint


def send(endpoint: str, frames: list[bytes]) -> Message:
    sock = make_socket(zmq.DEALER, connect=endpoint)
    try:
        sock.send_multipart(frames)
        assert sock.poll(10_000), "no reply"
        return decode(sock.recv_multipart())
    finally:
        sock.close(linger=0)


def table_size(endpoint: str) -> int:
    info = send(endpoint, encode(Message("info", sender="probe", seq=1)))
    return int(info["stats"]["tables"]["main"]["size"])


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("dim", [4.0, True])
def test_a_shape_dim_that_is_not_an_int_is_refused_after_the_same_layout_passed(replay: str, packed: bool,
                                                                                 dim: object) -> None:
    good = encode(Message("insert", {"table": "main"}, rows(1), sender="a", seq=1), packed=packed)
    assert send(replay, [bytes(f) for f in good]).type == "ack"
    frames = [bytes(f) for f in encode(Message("insert", {"table": "main"}, rows(1), sender="a", seq=2),
                                       packed=packed)]
    header = msgpack.unpackb(frames[0])
    obs = next(a for a in header["arrays"] if a[0] == "obs")
    obs[2] = [1, dim] if dim is not True else [True, 4]  # 4.0 == 4 and True == 1 in Python
    reply = send(replay, [msgpack.packb(header), *frames[1:]])
    assert reply.type == "error" and reply["reason"] == "bad_shape", reply.body
    assert "'obs'" in reply["detail"] and "ints" in reply["detail"]
    assert table_size(replay) == 1
