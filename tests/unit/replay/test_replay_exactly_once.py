"""4 writer processes x 50k transitions with forced duplicates and early resends: stored exactly once."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import zmq

import rlfleet.common.wire.dedup as dedup_mod
from harness.replay_helpers import PYTHON, ROOT, replay_config, serving, transitions
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.dedup import MAX_AHEAD, WINDOW, Dedup
from rlfleet.common.wire.transport import make_socket

WRITERS = 4
PER_WRITER = 50_000


def test_four_writers_exactly_once() -> None:
    cfg = replay_config(kind="prioritized", capacity=WRITERS * PER_WRITER + 1000, min_size=1)
    with serving(cfg) as server:
        procs = []
        for w in range(WRITERS):
            dup_every = 5 if w % 2 == 0 else 0  # writers 0, 2: every 5th insert sent twice at once
            resend_after = 0.01 if w >= 2 else 2.0  # writers 2, 3: resend before most acks arrive
            args = [PYTHON, str(ROOT / "harness" / "replay_helpers.py"), "writer", server.endpoint, str(w),
                    str(PER_WRITER), "256", str(dup_every), str(resend_after)]
            procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          env={**os.environ, "PYTHONPATH": str(ROOT)}))
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        table = server.tables["main"]
        total = WRITERS * PER_WRITER
        assert table.size == total and table.next_key == total
        writer = table.columns["writer"][:total].astype(np.int64)
        idx = table.columns["idx"][:total]
        ids = np.sort(writer * PER_WRITER + idx)
        np.testing.assert_array_equal(ids, np.arange(total))  # the exact set, each once
        # the data of each row is intact (obs is derived from idx)
        np.testing.assert_array_equal(table.columns["obs"][:total, 0], idx.astype(np.float32))
        # duplicates really happened and were acked as such or dropped while held
        assert results[0]["resends"] > 0 and results[2]["resends"] > 0
        assert server.duplicates >= results[0]["resends"] // 2
        assert sum(r["duplicates"] for r in results) > 0
        assert all(r["items"] == PER_WRITER for r in results)
        with SampleClient([server.endpoint], "check", "main", 8) as sc:
            stats = sc.info()
        assert stats["tables"]["main"]["inserted_items"] == total
        assert stats["duplicates"] == server.duplicates > 0
        # dedup state stays bounded: each writer's window, not its history
        assert all(len(s.above) <= 16 for s in server.dedup.senders.values())


def test_dedup_window_bound_applies_with_and_without_window_start() -> None:
    """As docs/protocol.md says: seqs below window_start, and all but the newest 4,096 stored seqs, are done."""
    d = Dedup()
    ws = 1_000
    d.add("a", ws + WINDOW - 1, ws)  # a full window of 4,096 un-acked inserts: ws .. ws + 4095
    assert not d.seen("a", ws)  # the oldest of them can still be stored
    assert d.seen("a", ws - 1)  # below window_start: done
    for seq in range(ws, ws + WINDOW - 1):
        d.add("a", seq, ws)
    assert all(d.seen("a", s) for s in range(ws, ws + WINDOW)) and len(d.senders["a"].above) == 0
    # only the newest 4,096 stored seqs are remembered: a sender with more than 4,096 stored above
    # its floor (here every other seq from 12, gaps never filled) has its oldest taken as done, even
    # while window_start names them
    for seq in range(12, 12 + 2 * (WINDOW + 1), 2):
        d.add("b", seq, 10)
    assert d.seen("b", 11) and d.seen("b", 12) and not d.seen("b", 13) and len(d.senders["b"].above) == WINDOW
    # a count, not a distance: one insert far ahead (with or without window_start) moves nothing
    d.add("c", 5)
    d.add("c", 5 + MAX_AHEAD)
    assert d.seen("c", 5) and not d.seen("c", 6) and not d.seen("c", 5 + MAX_AHEAD - 1)


def test_a_flood_of_new_senders_never_makes_a_live_sender_forget() -> None:
    """Replay forgets a sender only after IDLE_S of silence; while all it remembers are live, a new
    sender is refused (too_many_senders), so a live sender's resend is still a duplicate, never
    stored twice. Through the server's insert path, the server's dedup on a fake clock."""
    clock = [0.0]
    with serving(replay_config(capacity=1000, min_size=1), clock=lambda: clock[0]) as server:
        server.dedup.max_senders = 3
        sock = make_socket(zmq.DEALER, connect=server.endpoint)
        try:
            def insert(sender: str, seq: int) -> Message:
                msg = Message("insert", {"table": "main"}, transitions(0, seq, 2), sender=sender, seq=seq)
                sock.send_multipart(encode(msg))
                assert sock.poll(5000)
                return decode(sock.recv_multipart())

            assert insert("live", 1)["stored"] == 2
            for i in range(2):
                assert insert(f"x{i}", 1)["stored"] == 2
            clock[0] += 1.0
            refused = insert("flood", 1)  # full, and nobody has been idle for IDLE_S
            assert refused.type == "error" and refused["reason"] == "too_many_senders", refused.body
            reply = insert("live", 1)  # the live sender's resend: still known
            assert reply["duplicate"] is True and reply["stored"] == 0
            clock[0] += dedup_mod.IDLE_S + 1
            assert insert("live", 2)["stored"] == 2  # live again; x0 and x1 now idle
            assert insert("flood", 1)["stored"] == 2  # takes the place of the longest silent (x0)
            assert "x0" not in server.dedup.senders and "live" in server.dedup.senders
            late = insert("x0", 1)  # x0's resend after it was forgotten: refused, not stored twice
            assert late.type == "error" and late["reason"] == "sender_forgotten", late.body
            assert "new sender id" in late["detail"]
        finally:
            sock.close(linger=0)
        assert server.tables["main"].size == 10  # live 1 and 2, x0, x1, flood: nothing twice


def test_a_seq_far_ahead_of_the_window_is_refused_and_the_sender_goes_on() -> None:
    """A seq 2^63-1 (or anything beyond MAX_AHEAD above the floor) would move the window past every
    seq the sender has yet to send; it is refused and the sender's next inserts are stored."""
    with serving(replay_config(capacity=1000, min_size=1)) as server:
        sock = make_socket(zmq.DEALER, connect=server.endpoint)
        try:
            def insert(seq: int, window_start: int) -> Message:
                msg = Message("insert", {"table": "main", "window_start": window_start}, transitions(0, seq % 1000, 1),
                              sender="a", seq=seq)
                sock.send_multipart(encode(msg))
                assert sock.poll(5000)
                return decode(sock.recv_multipart())

            assert insert(1, 1)["stored"] == 1
            for far in (2 + dedup_mod.MAX_AHEAD, 2**63 - 1):
                refused = insert(far, far)
                assert refused.type == "error" and refused["reason"] == "seq_out_of_window", refused.body
                assert refused["ref_seq"] == far and str(dedup_mod.MAX_AHEAD) in refused["detail"]
            assert insert(2, 2)["stored"] == 1 and insert(3, 2)["stored"] == 1
            assert insert(1 + dedup_mod.MAX_AHEAD, 4)["stored"] == 1  # the bound itself is allowed
        finally:
            sock.close(linger=0)
        assert server.tables["main"].size == 4


def test_a_restored_sender_re_anchors_on_its_first_insert() -> None:
    """A snapshot may be older than what its senders have since sent: their first insert after the
    restart moves the window however far, resends at or below the restored floor stay duplicates."""
    d = Dedup()
    d.restore({"a": [10, [12]]})
    far = 10 + dedup_mod.MAX_AHEAD + 500
    assert d.refusal("a", far) is None and d.seen("a", 10) and d.seen("a", 12) and not d.seen("a", 11)
    d.add("a", far, far)
    assert d.seen("a", far - 1) and not d.seen("a", far + 1)
    assert d.refusal("a", far + dedup_mod.MAX_AHEAD + 1) is not None  # anchored again
