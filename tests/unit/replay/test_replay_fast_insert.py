"""The server's insert path without a full decode (ReplayServer._insert_fast): it stores exactly
what the full path stores, and refuses, acks duplicates of and logs exactly what the full path does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from harness.replay_helpers import replay_config, serving, transitions
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.inserts import InsertEncoder
from rlfleet.common.wire.transport import make_socket


def request(sock: zmq.Socket[Any], frames: list[Any], timeout_ms: int = 5000) -> Message:
    sock.send_multipart(frames)
    assert sock.poll(timeout_ms), "no reply"
    return decode(sock.recv_multipart())


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_fast_inserts_store_what_was_sent_across_the_ring_end(kind: str) -> None:
    with serving(replay_config(kind=kind, capacity=100)) as server:
        with InsertClient(server.endpoint, "a", max_unacked=4) as ic:
            for i in range(20):  # 16 items each: the ring of 100 wraps inside inserts 7, 13 and 19
                cols = transitions(0, 16 * i, 16)
                ic.insert("main", cols, priorities=np.linspace(1, 2, 16) + i if kind == "prioritized" else None)
            ic.flush(10)
        assert server.fast_inserts >= 17  # all but the first two of the connection (a layout is learnt at its 2nd)
        t = server.tables["main"]
        assert (t.size, t.next_key) == (100, 320)
        keys = np.arange(220, 320)
        slots = keys % 100
        np.testing.assert_array_equal(t.columns["idx"][slots], keys)
        np.testing.assert_array_equal(t.columns["obs"][slots], transitions(0, 220, 100)["obs"])
        np.testing.assert_array_equal(t.columns["done"][slots], transitions(0, 220, 100)["done"])
        if kind == "prioritized":
            expected = np.concatenate([np.linspace(1, 2, 16) + i for i in range(20)])[220:]
            np.testing.assert_allclose(t.priority[slots], expected)
            np.testing.assert_allclose(t.tree.get(slots), expected ** t.alpha)
            np.testing.assert_allclose(t.tree.total, (expected ** t.alpha).sum())


def test_fast_path_refuses_and_dedups_as_the_full_path() -> None:
    with serving(replay_config(kind="prioritized", capacity=1000)) as server:
        sock = make_socket(zmq.DEALER, connect=server.endpoint)
        enc = InsertEncoder()

        def frames(seq: int, **cols: Any) -> list[Any]:
            base = {**transitions(0, 4 * seq, 4), "priority": np.ones(4)}
            return enc.frames("main", {**base, **cols}, "w", seq, 1)

        try:
            for seq in (1, 2):  # the full path: the layout is learnt at its second insert
                assert request(sock, frames(seq))["stored"] == 4
            assert server.fast_inserts == 0 and len(server.fast_path.layouts) == 1
            assert request(sock, frames(3))["stored"] == 4
            assert server.fast_inserts == 1
            dup = request(sock, frames(2))
            assert (dup.type, dup["duplicate"], dup["stored"]) == ("ack", True, 0)
            bad = request(sock, frames(4, priority=np.array([1, np.nan, 1, 1])))
            assert (bad["reason"], bad["ref_seq"]) == ("bad_priority", 4)
            header, payload = frames(5)
            short = request(sock, [header, payload[:-8]])
            assert short["reason"] == "frame_length_mismatch"
            prefix = enc._prefix
            wrong_ws = prefix + msgpack.packb("x") + b"\xa3seq" + msgpack.packb(6)
            assert request(sock, [wrong_ws, payload])["reason"] == "bad_field"
            trailing = header + b"\xc0"
            assert request(sock, [trailing, payload])["reason"] == "bad_msgpack"
            assert request(sock, [prefix + msgpack.packb(1) + b"\xa3seq" + msgpack.packb(-1), payload])["reason"] \
                == "bad_field"
            ok = request(sock, frames(6))
            assert (ok.type, ok["stored"], ok["ref_seq"]) == ("ack", 4, 6)
        finally:
            sock.close(linger=0)
        t = server.tables["main"]
        assert t.size == 16 and server.fast_inserts == 2  # seqs 1, 2, 3 and 6; nothing bad was stored
        np.testing.assert_array_equal(t.columns["idx"][12:16], np.arange(24, 28))
        assert server.metrics.protocol_errors.labels("bad_priority")._value.get() == 1


def test_fast_inserts_are_logged_with_wal(tmp_path: Path) -> None:
    cfg = replay_config(capacity=1000)
    cfg.durability = "wal"
    with serving(cfg, directory=tmp_path) as server:
        with InsertClient(server.endpoint, "a") as ic:
            for i in range(10):
                ic.insert("main", transitions(0, 8 * i, 8))
            ic.flush(10)
        assert server.fast_inserts >= 5
    with serving(cfg, directory=tmp_path) as restored:
        t = restored.tables["main"]
        assert t.size == 80
        np.testing.assert_array_equal(t.columns["idx"][:80], np.arange(80))
        assert restored.dedup.seen("a", ic.first_seq + 9)


def test_writers_of_other_sizes_each_keep_their_fast_paths_and_ever_new_sizes_learn_nothing() -> None:
    with serving(replay_config(capacity=10_000)) as server:
        with InsertClient(server.endpoint, "a") as a, InsertClient(server.endpoint, "b") as b, \
                InsertClient(server.endpoint, "c") as c, InsertClient(server.endpoint, "d") as d:
            for i in range(10):
                a.insert("main", transitions(0, 8 * i, 8))
                b.insert("main", transitions(1, 16 * i, 16))
                c.insert("main", transitions(2, 100 * i, 5 + i % 2))  # two sizes, in turn
                d.insert("main", transitions(3, 100 * i, 1 + i))  # a new size every insert
                a.flush(10), b.flush(10), c.flush(10), d.flush(10)
            # a and b: all but their first two; c: all but the first two of each size; d: none
            assert server.fast_inserts == 8 + 8 + 6
            layouts = server.fast_path.layouts
            assert len(layouts) == 3 and len(layouts[next(iter(layouts))]) == 1
        t = server.tables["main"]
        assert t.size == 80 + 160 + 55 + 55
        cols = {k: v[:t.size] for k, v in t.columns.items()}
        for writer, n in ((0, 80), (1, 160)):
            np.testing.assert_array_equal(np.sort(cols["idx"][cols["writer"] == writer]), np.arange(n))
        expected = np.concatenate([np.arange(100 * i, 100 * i + 5 + i % 2) for i in range(10)])
        np.testing.assert_array_equal(np.sort(cols["idx"][cols["writer"] == 2]), expected)
        expected = np.concatenate([np.arange(100 * i, 100 * i + 1 + i) for i in range(10)])
        np.testing.assert_array_equal(np.sort(cols["idx"][cols["writer"] == 3]), expected)


def test_a_zero_width_column_is_stored_and_the_server_goes_on() -> None:
    # a (4, 0) column has no bytes to view: learning its layout once crashed the serve loop
    with serving(replay_config(kind="uniform", capacity=10)) as server:
        sock = make_socket(zmq.DEALER, connect=server.endpoint)
        enc = InsertEncoder()
        try:
            for seq in (1, 2, 3):
                cols = {"obs": np.full((4, 3), seq, np.float32), "e": np.zeros((4, 0), np.float32)}
                reply = request(sock, enc.frames("main", cols, "w", seq, 1))
                assert reply.type == "ack" and reply["stored"] == 4, reply.body
            assert server.fast_inserts == 1  # the third, once the layout was learnt at the second
            t = server.tables["main"]
            assert (t.size, t.next_key) == (10, 12) and t.columns["e"].shape == (10, 0)
            np.testing.assert_array_equal(t.columns["obs"][8:10], np.full((2, 3), 3, np.float32))
            assert request(sock, encode(Message("info", {}))).type == "info_reply"
        finally:
            sock.close(0)
