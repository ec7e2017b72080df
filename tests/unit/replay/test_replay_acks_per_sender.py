"""An ack names seqs only: inserts of two senders sharing one connection, even with the same seq, are
acked apart, never merged into one ack (issue 42's doc points). Real sockets, one burst."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from harness.replay_helpers import replay_config, serving, transitions
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.transport import make_socket


@pytest.fixture
def endpoint() -> Iterator[str]:
    with serving(replay_config()) as server:
        yield server.endpoint


@pytest.mark.parametrize("merge", [False, True])
def test_two_senders_on_one_connection_get_an_ack_each(endpoint: str, merge: bool) -> None:
    sock = make_socket(zmq.DEALER, connect=endpoint)
    try:
        body = {"table": "main", "merge_acks": True} if merge else {"table": "main"}
        frames = [encode(Message("insert", body, transitions(i, 0, 2), sender=s, seq=7)) for i, s in enumerate("ab")]
        for f in frames:  # back to back: one burst for the server
            sock.send_multipart(f)
        acks = []
        while sock.poll(1000):
            acks.append(decode(sock.recv_multipart()))
        assert [(a.type, a["ref_seq"], a["stored"], a.body.get("more")) for a in acks] == [("ack", 7, 2, None)] * 2
    finally:
        sock.close(linger=0)
