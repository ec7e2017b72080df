"""Inserts a hostile client writes from docs/protocol.md alone, refused before anything is stored (real sockets).

The learner's table of a replay that could make the env holds what the algorithm's actors insert (DQN on
CartPole here): besides its columns' dtypes and shapes, their values (common/algorithms/values.py). NaN
observations, an Inf reward, a discount of -5, action 2**62 on a 2-action env used to be stored and
sampled; each is refused with ``bad_value`` naming the column, on the full path and on the fast path of a
connection whose inserts repeat one layout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from harness.fuzzing import rows
from harness.replay_helpers import replay_config, serving
from harness.service_procs import ROOT, ServiceProcess
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.transport import free_tcp_port, make_socket

DYNAQ = ROOT / "configs" / "cartpole-dynaq.yaml"


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


def table_size(endpoint: str, table: str = "main") -> int:
    info = send(endpoint, encode(Message("info", sender="probe", seq=1)))
    return int(info["stats"]["tables"][table]["size"])


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


def transitions(n: int, **columns: object) -> dict[str, np.ndarray]:
    """DQN's CartPole columns, valid unless ``columns`` says otherwise (one value for every row)."""
    good: dict[str, np.ndarray] = {
        "obs": np.zeros((n, 4), np.float32), "action": np.ones(n, np.int64), "reward": np.ones(n, np.float32),
        "next_obs": np.zeros((n, 4), np.float32), "discount": np.full(n, 0.99, np.float32),
        "version": np.zeros(n, np.int64)}
    for name, value in columns.items():
        good[name] = np.full_like(good[name], value)  # type: ignore[call-overload]
    return good


@pytest.fixture(scope="module")
def dqn_replay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    nowhere = f"tcp://127.0.0.1:{free_tcp_port()}"  # no paramserver: versions are not the point here
    # parallel Dyna-Q's config: the learner's table main and the planners' imagined one, both fixed to DQN's columns
    proc = ServiceProcess("replay", Path(tmp_path_factory.mktemp("replay")),
                          [f"network.replay=[{address}]", f"network.paramserver=[{nowhere}]"], config=DYNAQ)
    try:
        proc.wait_healthy(60)
        yield address
    finally:
        proc.stop()


BAD = [("obs", np.nan, "nan"), ("next_obs", -np.inf, "-inf"), ("reward", np.inf, "inf"),
       ("discount", -5.0, "0 to 1"), ("discount", 1.5, "0 to 1"), ("action", 2**62, "0 to 1"),
       ("action", -1, "0 to 1")]


@pytest.mark.parametrize("table", ["main", "imagined"])  # imagined: the planners' (Dyna-Q), the same columns
@pytest.mark.parametrize("column,value,allowed", BAD)
def test_values_no_actor_could_insert_are_refused_naming_the_column(dqn_replay: str, column: str, value: object,
                                                                    allowed: str, table: str) -> None:
    before = table_size(dqn_replay, table)
    reply = send(dqn_replay, encode(Message("insert", {"table": table}, transitions(3, **{column: value}),
                                            sender=f"forger-{table}-{column}-{value}", seq=1)))
    assert reply.type == "error" and reply["reason"] == "bad_value", reply.body
    assert f"column {column!r}" in reply["detail"] and allowed in reply["detail"], reply["detail"]
    assert table_size(dqn_replay, table) == before


def test_the_imagined_table_stores_valid_transitions(dqn_replay: str) -> None:
    before = table_size(dqn_replay, "imagined")
    reply = send(dqn_replay, encode(Message("insert", {"table": "imagined"}, transitions(3), sender="planner-0/1",
                                            seq=1)))
    assert reply.type == "ack" and reply["stored"] == 3, reply.body
    assert table_size(dqn_replay, "imagined") == before + 3


def test_the_fast_path_refuses_bad_values_too(dqn_replay: str) -> None:
    before = table_size(dqn_replay)
    with InsertClient(dqn_replay, "actor-fast/1") as client:
        for _ in range(10):  # one layout again and again: the fast path takes them from their frames
            client.insert("main", transitions(4))
            client.flush(10)
        assert send(dqn_replay, encode(Message("info", sender="probe", seq=1)))["stats"]["fast_inserts"] > 0
        client.insert("main", transitions(4, obs=np.nan))
        client.flush(10)  # refused for its values: dropped and counted by the client, not raised
        assert (client.inserts_refused, client.items_refused) == (1, 4)
    assert table_size(dqn_replay) == before + 40


def test_an_empty_sender_is_refused(dqn_replay: str) -> None:
    before = table_size(dqn_replay)
    reply = send(dqn_replay, encode(Message("insert", {"table": "main"}, transitions(2), sender="", seq=1)))
    assert reply.type == "error" and reply["reason"] == "bad_field" and "header.sender" in reply["detail"]
    assert table_size(dqn_replay) == before
