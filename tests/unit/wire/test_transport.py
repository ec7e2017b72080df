"""Sockets, the server loop and CurveZMQ over real tcp, ipc and inproc endpoints."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.errors import CommTimeout, RemoteError, RequestError
from rlfleet.common.wire.server import Peer, Server
from rlfleet.common.wire.transport import (
    CurveConfig,
    bind_retrying,
    context,
    ephemeral_ports,
    free_tcp_port,
    rejected_clients,
)


class EchoServer(Server):
    """Echoes arrays back in an info_reply-shaped batch; fails on request."""

    def __init__(self, bind: str, curve: CurveConfig | None = None) -> None:
        super().__init__(ServiceMetrics("echo"), bind, curve=curve)
        self.route("info", self.on_info)
        self.route("insert", self.on_insert)
        self.route("get", self.on_get)

    def on_info(self, peer: Peer, msg: Message) -> None:
        self.reply(peer, Message("info_reply", {"service": "echo", "shard": 0, "stats": {"from": msg.sender}}))

    def on_insert(self, peer: Peer, msg: Message) -> None:
        if msg["table"] == "explode":
            raise ZeroDivisionError("boom")
        if msg["table"] == "refuse":
            raise RequestError("schema_mismatch", "column x has the wrong dtype")
        total = int(sum(a.sum() for a in msg.arrays.values()))
        self.reply(peer, Message("ack", {"stored": total, "duplicate": False}))

    def on_get(self, peer: Peer, msg: Message) -> None:
        pass  # never answers: the client's timeout must fire


@pytest.fixture
def serve() -> Iterator:
    started: list[tuple[Server, threading.Thread]] = []

    def start(server: Server) -> Server:
        t = threading.Thread(target=server.serve, daemon=True)
        t.start()
        started.append((server, t))
        return server

    yield start
    for server, t in started:
        server.stop()
        t.join(5)
        server.close()


def endpoints(tmp: Path) -> list[str]:
    return ["tcp://127.0.0.1:0", f"ipc://{tmp}/echo.sock", f"inproc://echo-{time.monotonic_ns()}"]


@pytest.mark.parametrize("kind", ["tcp", "ipc", "inproc"])
def test_request_reply_over_every_transport(kind: str, tmp_path: Path, serve) -> None:
    bind = {e.split(":")[0]: e for e in endpoints(tmp_path)}[kind]
    server = serve(EchoServer(bind))
    with Connection(server.endpoint, "tester") as client:
        reply = client.request(Message("info"), timeout_s=5)
        assert reply.type == "info_reply" and reply["stats"] == {"from": "tester"}
        arrays = {"a": np.arange(10), "b": np.ones((3, 3), np.float32)}
        assert client.request(Message("insert", {"table": "t"}, arrays), 5)["stored"] == 45 + 9


def test_timeouts_become_comm_timeout(serve) -> None:
    server = serve(EchoServer("tcp://127.0.0.1:0"))
    with Connection(server.endpoint, "tester") as client:
        with pytest.raises(CommTimeout):
            client.request(Message("get", {"have_version": 0}), timeout_s=0.2)
        # and the server still answers the next request
        assert client.request(Message("info"), 5).type == "info_reply"
    with Connection("tcp://127.0.0.1:1", "nobody") as client, pytest.raises(CommTimeout):
        client.request(Message("info"), timeout_s=0.2)


def test_server_survives_garbage_failing_handlers_and_unknown_types(serve) -> None:
    server = serve(EchoServer("tcp://127.0.0.1:0"))
    with Connection(server.endpoint, "tester") as client:
        client.sock.send_multipart([b"\x00garbage", b"more"])
        err = client.recv(5)
        assert err.type == "error" and err["reason"] == "bad_msgpack"
        with pytest.raises(RemoteError) as info:
            client.request(Message("insert", {"table": "explode"}, {"x": np.zeros(1)}), 5)
        assert info.value.reason == "internal" and "boom" in info.value.detail
        with pytest.raises(RemoteError) as info:
            client.request(Message("insert", {"table": "refuse"}, {"x": np.zeros(1)}), 5)
        assert info.value.reason == "schema_mismatch"
        with pytest.raises(RemoteError) as info:
            client.request(Message("wait", {"min_version": 1, "timeout_ms": 1}), 5)
        assert info.value.reason == "unsupported_type"
        assert client.request(Message("info"), 5).type == "info_reply"
    text = server.metrics.exposition().decode()
    for reason in ("bad_msgpack", "internal", "schema_mismatch", "unsupported_type"):
        assert f'rlfleet_protocol_errors_total{{reason="{reason}",service="echo",shard="0"}} 1.0' in text


def test_a_flood_from_a_client_that_never_reads_does_not_block_the_server(serve) -> None:
    server = serve(EchoServer("tcp://127.0.0.1:0"))
    rude = zmq.Context.instance().socket(zmq.DEALER)
    rude.setsockopt(zmq.LINGER, 0)
    rude.setsockopt(zmq.RCVHWM, 10)
    rude.connect(server.endpoint)
    try:
        for _ in range(5000):
            rude.send(b"junk")
        with Connection(server.endpoint, "polite") as client:
            assert client.request(Message("info"), 10).type == "info_reply"
    finally:
        rude.close(0)


def curve_pair() -> CurveConfig:
    pub, sec = zmq.curve_keypair()
    return CurveConfig(public_key=pub, secret_key=sec)


def test_curve_accepts_allowlisted_clients_and_rejects_strangers(serve) -> None:
    server_keys, friend, stranger = curve_pair(), curve_pair(), curve_pair()
    server_keys.allowed_clients = [friend.public_key]
    server = serve(EchoServer("tcp://127.0.0.1:0", curve=server_keys))
    friend.server_key = stranger.server_key = server_keys.public_key
    with Connection(server.endpoint, "friend", curve=friend) as client:
        assert client.request(Message("info"), 5).type == "info_reply"
    with Connection(server.endpoint, "stranger", curve=stranger) as client:
        with pytest.raises(CommTimeout):
            client.request(Message("info"), timeout_s=0.5)
    assert sum(rejected_clients().values()) >= 1
    # a plain-text client is not served either
    with Connection(server.endpoint, "plain") as client, pytest.raises(CommTimeout):
        client.request(Message("info"), timeout_s=0.5)


def test_curve_servers_open_and_close_in_a_row_in_one_process(serve) -> None:
    # each server socket has its own ZAP domain and handshake monitor; a socket opened right
    # after a close reuses the file descriptor, which must not collide with the old monitor
    keys, friend = curve_pair(), curve_pair()
    keys.allowed_clients = [friend.public_key]
    friend.server_key = keys.public_key
    for _ in range(500):  # collided within a few hundred before the monitor had an address of its own
        EchoServer("tcp://127.0.0.1:0", curve=keys).close()
    server = serve(EchoServer("tcp://127.0.0.1:0", curve=keys))
    with Connection(server.endpoint, "friend", curve=friend) as client:
        assert client.request(Message("info"), 5).type == "info_reply"


def test_a_watching_client_never_collides_with_a_monitor_endpoint_still_bound(serve) -> None:
    # pyzmq names a monitor endpoint after the socket's file descriptor; a descriptor reused
    # while the reaper has not yet unbound the old endpoint made the next client fail with
    # "Address already in use" (seen once in CI). Hold every such name: a client must still open.
    server = serve(EchoServer("tcp://127.0.0.1:0"))
    squatter = context().socket(zmq.PAIR)
    try:
        for fd in range(1024):
            squatter.bind(f"inproc://monitor.s-{fd}")
        with Connection(server.endpoint, "watcher", watch_handshakes=True) as client:
            assert client.request(Message("info"), 5).type == "info_reply"
            deadline = time.monotonic() + 5
            while client.reconnected() == 0 and client.connects == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert client.connects == 1  # its own handshake, seen through its own monitor
    finally:
        squatter.close(linger=0)


def test_encode_sends_array_memory_without_copy() -> None:
    big = np.arange(1 << 16, dtype=np.float64)
    frames = encode(Message("insert", {"table": "t"}, {"x": big}))
    assert np.shares_memory(frames[1], big)


def test_free_ports_are_distinct_and_never_from_the_range_outgoing_connections_use() -> None:
    # a port from the ephemeral range can be taken by any outgoing connection (a client's local
    # port) between the choice and the bind: the launcher's learner once failed to bind its metrics
    low, high = ephemeral_ports()
    ports = [free_tcp_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high]
    with socket.socket() as s:  # and each is free to bind
        s.bind(("127.0.0.1", ports[-1]))


def test_a_bind_waits_out_a_listener_that_is_closing_and_then_names_a_held_address() -> None:
    port = free_tcp_port()
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    sock = context().socket(zmq.ROUTER)
    try:
        with pytest.raises(zmq.ZMQError, match="already in use") as refused:  # held throughout: the error
            bind_retrying(sock, f"tcp://127.0.0.1:{port}", retry_s=0.3)
        assert refused.value.errno == zmq.EADDRINUSE
        closing = threading.Event()

        def release() -> None:  # a listener that goes away while the bind retries
            closing.set()  # before the close: a bind that got through came after this
            holder.close()

        threading.Timer(0.3, release).start()
        bind_retrying(sock, f"tcp://127.0.0.1:{port}", retry_s=60.0)
        assert closing.is_set()  # it waited for the port rather than binding beside the holder
        assert sock.getsockopt_string(zmq.LAST_ENDPOINT) == f"tcp://127.0.0.1:{port}"
    finally:
        holder.close()
        sock.close(linger=0)
