"""Exactly-once with no horizon that can be outlived (issue 42, attack 1), real sockets.

Replay forgets a sender (to make room for new ones) only after 10 minutes of silence. It
used to keep the names of forgotten senders, "as many again": after two horizons and twice
as many new senders, a forgotten sender's resend was acked ``stored=1 duplicate=false`` and
stored twice. Now it keeps one number instead, the highest seq any forgotten sender had
stored, for as long as it lives and across restarts; a resend at or below it from a sender
it does not remember is refused (``sender_forgotten``), whatever came in between.
"""

from __future__ import annotations

import os
from pathlib import Path

import rlfleet.common.wire.dedup as dedup_mod
from harness.replay_helpers import ask, serving, transitions
from rlfleet.common.config import ReplayConfig, TableConfig
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.dedup import Dedup
from rlfleet.services.replay.server import ReplayServer

T0 = 1_000_000  # some sender's first seq (a client's start where replay's first_seq says)


def insert(server: ReplayServer, sender: str, seq: int) -> Message:
    return ask(server.endpoint, Message("insert", {"table": "main"}, transitions(0, 0, 1)), sender, seq)


def config() -> ReplayConfig:
    return ReplayConfig(tables=[TableConfig(name="main", kind="uniform", capacity=10_000, min_size=1)],
                        durability="checkpoint")


def test_a_forgotten_senders_resend_is_refused_after_any_number_of_horizons(
        tmp_path: Path) -> None:
    clock = [0.0]
    with serving(config(), tmp_path, clock=lambda: clock[0]) as server:
        server.dedup.max_senders = 3
        assert insert(server, "victim", T0)["stored"] == 1
        for i in range(2):
            assert insert(server, f"early-{i}", T0 + 1 + i)["stored"] == 1
        newest = T0 + 10
        for horizon in range(5):  # each horizon as many new senders as it remembers: 5 times over in all
            clock[0] += dedup_mod.IDLE_S + 1
            for i in range(3):
                newest += 1
                assert insert(server, f"new-{horizon}-{i}", newest)["stored"] == 1
            assert "victim" not in server.dedup.senders
            clock[0] += dedup_mod.IDLE_S + 1  # all idle again: there is room for a sender
            reply = insert(server, "victim", T0)  # its resend, its ack lost long ago
            assert reply.type == "error" and reply["reason"] == "sender_forgotten", (horizon, reply.body)
        assert "'victim'" in reply["detail"] and f"allowed: seqs above {newest - 3}" in reply["detail"]
        assert server.tables["main"].size == 3 + 15  # the victim's insert once
        server.snapshot(wait=True)
    with serving(config(), tmp_path, clock=lambda: clock[0]) as server:  # and after a restart from the snapshot
        server.dedup.max_senders = 3
        reply = insert(server, "victim", T0)
        assert reply.type == "error" and reply["reason"] == "sender_forgotten", reply.body
        clock[0] += dedup_mod.IDLE_S + 1  # room for one more
        fresh = server.dedup.first_seq("victim-again")  # what its client asks info for
        assert fresh == newest - 3 + 1
        assert insert(server, "victim-again", fresh)["stored"] == 1  # a new id goes on


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_stays_bounded_at_a_million_senders() -> None:
    """1M senders through a Dedup that remembers the default 100,000, measured: it holds 100,000 senders and
    one int, its resident memory stays under the bound docs/protocol.md states (1 KB a remembered sender,
    100 MB; measured 59 MB at 100,000 senders, 82 MB from 1.2M to 3M senders: the allocator's fragmentation,
    flat), and every forgotten sender's resend is refused. A list of forgotten names would hold 1M."""
    clock = [0.0]
    before = resident_bytes()
    d = Dedup(clock=lambda: clock[0])
    remembered = d.max_senders
    assert remembered == 100_000
    for i in range(1_000_000):
        if i % remembered == 0:
            clock[0] += dedup_mod.IDLE_S + 1
        name = f"actor-{i % 64}/{i:032x}"
        assert d.refusal(name, T0 + i) is None
        d.add(name, T0 + i, T0 + i)
    grown = resident_bytes() - before
    assert len(d) == remembered and d.watermark == T0 + 900_000 - 1
    assert grown <= remembered * 1000, f"{grown / 1e6:.0f} MB resident for {remembered} remembered senders"
    for i in range(0, 900_000, 9_973):  # forgotten: each one's resend is refused
        assert d.refusal(f"actor-{i % 64}/{i:032x}", T0 + i) is not None


def test_a_sender_that_stored_a_far_seq_cannot_lock_out_new_senders_once_forgotten() -> None:
    """One insert as far ahead as a first seq may be, then silence until forgotten: the watermark moves up
    by at most MAX_FIRST_AHEAD, and a new client, whose seqs start at the first_seq the server answers,
    is taken (clients whose seqs came from their wall clock were refused for good once a squatter moved
    the watermark past the clock, so the watermark was capped at the server's clock)."""
    clock = [0.0]
    d = Dedup(max_senders=2, clock=lambda: clock[0])
    far = d.watermark + dedup_mod.MAX_FIRST_AHEAD
    assert d.refusal("squatter", far + 1) is not None  # one further is refused
    assert d.refusal("squatter", far) is None
    d.add("squatter", far, far)
    d.add("honest", T0, T0)
    clock[0] += dedup_mod.IDLE_S + 1
    d.add("newcomer", T0 + 5, T0 + 5)  # the squatter is forgotten to make room
    assert "squatter" not in d.senders and d.watermark == far
    fresh = d.first_seq("actor-0/fresh")
    assert fresh == far + 1 and d.refusal("actor-0/fresh", fresh) is None  # a new client: taken
    assert d.refusal("actor-0/fresh", far + dedup_mod.MAX_FIRST_AHEAD) is None
    assert d.refusal("honest-resend", T0) is not None  # below the watermark: still refused


def test_a_sender_id_seen_again_after_it_was_forgotten_keeps_its_bound_across_a_restart(
        tmp_path: Path) -> None:
    """A sender id that comes back after replay forgot it is a new sender born at the watermark: the old
    incarnation's resends (at or below it) stay refused. That bound (``born``) was not in the snapshot, so
    after a restart the old incarnation's resend was stored a second time."""
    clock = [0.0]
    with serving(config(), tmp_path, clock=lambda: clock[0]) as server:
        server.dedup.max_senders = 2
        assert insert(server, "victim", T0)["stored"] == 1
        assert insert(server, "filler", T0 + 1)["stored"] == 1
        clock[0] += dedup_mod.IDLE_S + 1
        assert insert(server, "newcomer", T0 + 5)["stored"] == 1  # the victim is forgotten to make room
        assert "victim" not in server.dedup.senders and server.dedup.watermark == T0
        clock[0] += dedup_mod.IDLE_S + 1
        # the same id again (no window_start: its window reaches 4,096 seqs below), born at the watermark
        assert insert(server, "victim", T0 + 100)["stored"] == 1
        reply = insert(server, "victim", T0)  # the first incarnation's resend
        assert reply.type == "error" and reply["reason"] == "sender_forgotten", reply.body
        size = server.tables["main"].size
        server.snapshot(wait=True)
    with serving(config(), tmp_path, clock=lambda: clock[0]) as server:
        server.dedup.max_senders = 2
        assert server.dedup.senders["victim"].born == T0
        reply = insert(server, "victim", T0)
        assert reply.type == "error" and reply["reason"] == "sender_forgotten", reply.body
        assert server.tables["main"].size == size
        assert insert(server, "victim", T0 + 101)["stored"] == 1  # its own next insert goes on
