"""Where a sender's seqs start is replay's word, not a clock's (issue 43, item 7). Real sockets.

InsertClient's seqs started at its host's wall clock in microseconds. A sender restarted under its id
after that clock stepped back started below its old seqs: replay acked its new inserts as duplicates of
the old ones and stored none of them (or refused them, further back). Now a client asks replay
(``info_reply``'s ``first_seq``) before its first insert: after the last stored seq of an id replay
remembers, above every seq of every sender it forgot.
"""

from __future__ import annotations

from pathlib import Path

from harness.replay_helpers import ask, serving, transitions
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.config import ReplayConfig, TableConfig
from rlfleet.common.wire.codec import Message

STEPPED = 1_000_000  # the first incarnation's clock when it started, in microseconds
BACK = 3_000  # how far that clock steps back before the restart (3 ms: within the seq window)


def config() -> ReplayConfig:
    return ReplayConfig(tables=[TableConfig(name="main", kind="uniform", capacity=10_000, min_size=1)],
                        durability="checkpoint")


def run(endpoint: str, sender: str, seq_start: int | None, inserts: int, start: int) -> InsertClient:
    client = InsertClient(endpoint, sender, seq_start=seq_start)
    for i in range(inserts):
        client.insert("main", transitions(0, start + 10 * i, 10), timeout_s=10)
    client.flush(10)
    client.close()
    return client


def test_a_sender_restarted_under_its_id_after_its_clock_stepped_back_has_its_inserts_stored(tmp_path: Path) -> None:
    with serving(config(), tmp_path) as server:
        # the first incarnation, numbered from its clock as clients used to be: 20 inserts stored
        first = run(server.endpoint, "actor-7", STEPPED, 20, 0)
        assert first.acked == 20 and server.tables["main"].size == 200
        # the clock stepped back: numbered from it, a restart's inserts were duplicates of the old ones
        old_way = ask(server.endpoint, Message("insert", {"table": "main", "window_start": STEPPED + 20 - BACK},
                                              transitions(0, 900, 10)), "actor-7", STEPPED + 20 - BACK)
        assert old_way["duplicate"] and old_way["stored"] == 0
        # restarted under the same id, its seqs from replay: every insert stored, none a duplicate
        second = run(server.endpoint, "actor-7", None, 20, 1000)
        assert second.first_seq == STEPPED + 20
        assert second.acked == 20 and second.duplicates == 0
        assert server.tables["main"].size == 400
        server.snapshot(wait=True)
    # replay restarted from its snapshot (the sender restored, re-anchored by its next insert), and the
    # sender restarted again: still after its last stored seq, whatever its clock says
    with serving(config(), tmp_path) as server:
        third = run(server.endpoint, "actor-7", None, 5, 2000)
        assert third.first_seq == STEPPED + 40
        assert third.acked == 5 and third.duplicates == 0
        assert server.tables["main"].size == 450


def test_a_new_sender_starts_above_every_forgotten_senders_seqs_whatever_its_clock(tmp_path: Path) -> None:
    clock = [0.0]
    with serving(config(), tmp_path, clock=lambda: clock[0]) as server:
        server.dedup.max_senders = 1
        run(server.endpoint, "ahead", STEPPED, 3, 0)  # a host whose clock ran ahead
        clock[0] += 601.0
        run(server.endpoint, "other", None, 1, 100)  # "ahead" is forgotten to make room
        assert server.dedup.watermark == STEPPED + 2
        clock[0] += 601.0
        late = run(server.endpoint, "behind/new", None, 3, 200)  # a host whose clock runs behind: taken
        assert late.first_seq == STEPPED + 3 and late.acked == 3 and late.duplicates == 0
