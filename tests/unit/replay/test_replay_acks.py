"""Merged acks: inserts sent with merge_acks share one ack per sender and burst; others keep one each."""

from __future__ import annotations

import threading
from typing import Any

import zmq

from harness.replay_helpers import replay_config, transitions
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.transport import make_socket, recv_frames
from rlfleet.services.replay.server import ReplayServer


def insert(seq: int, merge: bool, sender: str = "actor") -> list[Any]:
    body = {"table": "main", "window_start": 1, **({"merge_acks": True} if merge else {})}
    return encode(Message("insert", body, transitions(0, 10 * seq, 10), sender=sender, seq=seq))


def test_one_burst_of_merge_acks_inserts_gets_one_ack_the_others_one_each() -> None:
    """Driven by hand (no loop thread): the eight messages are handled, then the server ticks, as
    its loop does with a burst."""
    server = ReplayServer(replay_config(), ServiceMetrics("replay"), "tcp://127.0.0.1:0")
    sock = make_socket(zmq.DEALER, connect=server.endpoint)
    try:
        burst = [insert(s, True) for s in range(1, 6)] + [insert(2, True), insert(6, False), insert(7, False)]
        for frames in burst:
            sock.send_multipart(frames)
        for _ in burst:  # one burst: every message handled before the tick
            assert server.sock.poll(10_000)
            server.handle_frames(recv_frames(server.sock))
        server.tick()
        acks = []
        while len(acks) < 3 and sock.poll(5000):
            acks.append(decode(sock.recv_multipart()))
        assert not sock.poll(300), "more replies than one merged ack and two single ones"
        assert [a.type for a in acks] == ["ack"] * 3
        merged = [a for a in acks if a.get("more")]
        assert len(merged) == 1
        m = merged[0]
        answered = [[m["ref_seq"], m["stored"], m["duplicate"]], *m["more"]]
        assert answered == [[1, 10, False], [2, 10, False], [3, 10, False], [4, 10, False], [5, 10, False],
                            [2, 0, True]]
        singles = sorted((a["ref_seq"], a["stored"], a["duplicate"], a.get("more")) for a in acks if a is not m)
        assert singles == [(6, 10, False, None), (7, 10, False, None)]
        assert server.tables["main"].size == 70
    finally:
        sock.close(linger=0)
        server.close()


def test_insert_client_counts_every_insert_of_a_merged_ack() -> None:
    server = ReplayServer(replay_config(capacity=10_000), ServiceMetrics("replay"), "tcp://127.0.0.1:0")
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    client = InsertClient(server.endpoint, "merged", max_unacked=64)
    try:
        for i in range(200):
            client.insert("main", transitions(0, 10 * i, 10))
        client.flush(10)
        assert (client.acked, client.items_acked, client.unacked, client.unacked_bytes) == (200, 2000, 0, 0)
        assert server.tables["main"].size == 2000
    finally:
        client.close()
        server.stop()
        thread.join(10)
        server.close()
