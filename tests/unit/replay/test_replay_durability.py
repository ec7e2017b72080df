"""Durability: wal survives kill -9 with every acked insert; checkpoint round trip; torn logs."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from harness.replay_helpers import PYTHON, ROOT, ReplayProcess, ask, replay_config, serving, transitions
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.config import ReplayConfig, TableConfig
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.errors import CommTimeout
from rlfleet.common.wire.transport import make_socket
from rlfleet.services.replay.server import ReplayServer
from rlfleet.services.replay.storage import SNAPSHOT, read_log_file, read_snapshot

TABLE = "replay.tables=[{name: main, kind: prioritized, capacity: 100000, min_size: 1, columns: first_insert}]"
BATCH = 128


def snapshot_ids(run_dir: Path) -> np.ndarray:
    _, arrays = read_snapshot(run_dir / "replay" / "shard-0" / SNAPSHOT)
    return np.sort(arrays["main/idx"])


def test_wal_kill9_keeps_every_acked_insert_and_stays_exactly_once(tmp_path: Path) -> None:
    sets = (TABLE, "replay.durability=wal", "replay.checkpoint_every_s=0.2")
    rp = ReplayProcess(tmp_path, sets=sets).start()
    try:
        rp.wait_log("running")
        client = InsertClient(rp.address, "actor-0", max_unacked=8, resend_after_s=0.5)
        seqs = []
        for b in range(150):
            seqs.append(client.insert("main", transitions(0, b * BATCH, BATCH), timeout_s=30))
        client.poll(0.05)
        rp.kill()  # mid-stream: up to 8 inserts un-acked, maybe a snapshot half written
        client.poll(0)
        acked = [b for b, s in enumerate(seqs) if s not in client._window]
        assert len(acked) >= 100
        # restart and stop at once: the snapshot written on SIGTERM shows what was restored
        rp2 = ReplayProcess(tmp_path, port=rp.port, sets=sets).start()
        rp2.wait_log("running")
        restored = int(re.search(r"restored (\d+) items", rp2.log()).group(1))  # type: ignore[union-attr]
        assert rp2.terminate() == 0
        ids = snapshot_ids(tmp_path)
        want = np.concatenate([np.arange(b * BATCH, (b + 1) * BATCH) for b in acked])
        assert np.isin(want, ids).all(), "an acked transition was lost"
        assert restored == len(ids) >= len(want)
        assert len(np.unique(ids)) == len(ids)
        # continue: the un-acked inserts are resent, duplicates of stored ones are recognised
        rp3 = ReplayProcess(tmp_path, port=rp.port, sets=sets).start()
        rp3.wait_log("running")
        for b in range(150, 200):
            client.insert("main", transitions(0, b * BATCH, BATCH), timeout_s=30)
        client.flush(30)
        assert rp3.terminate() == 0
        np.testing.assert_array_equal(snapshot_ids(tmp_path), np.arange(200 * BATCH))  # all, each once
        client.close()
    finally:
        for p in (rp, locals().get("rp2"), locals().get("rp3")):
            if p is not None:
                p.cleanup()


def test_checkpoint_round_trip_through_sigterm(tmp_path: Path) -> None:
    sets = (TABLE, "replay.durability=checkpoint", "replay.checkpoint_every_s=600")
    rp = ReplayProcess(tmp_path, sets=sets).start()
    try:
        rp.wait_log("running")
        with InsertClient(rp.address, "actor-0", seq_start=1000) as ic:
            for b in range(10):
                ic.insert("main", transitions(0, b * BATCH, BATCH))
            ic.flush(10)
        with SampleClient([rp.address], "learner", "main", 64, in_flight=1) as sc:
            batch = sc.sample(timeout_s=10)
            sc.update_priorities(batch, np.full(64, 1e4))
            while sc.priorities_acked < 1:
                sc.poll(0.1)
        assert rp.terminate() == 0
        assert "final snapshot of 1280 items" in rp.log()
        rp2 = ReplayProcess(tmp_path, port=rp.port, sets=sets).start()
        rp2.wait_log("running")
        assert "restored 1280 items" in rp2.log()
        with SampleClient([rp2.address], "learner", "main", 256, in_flight=1) as sc:
            stats = sc.info()["tables"]["main"]
            assert (stats["size"], stats["next_key"]) == (1280, 1280)
            b2 = sc.sample(timeout_s=10)
            np.testing.assert_array_equal(b2.data["idx"], b2.keys.astype(np.int64))  # data follows its key
            # the updated priorities survived: those keys dominate the sample
            hot = np.isin(b2.keys, batch.keys).mean()
            assert hot > 0.8  # ~93% expected with alpha 0.6
        # the dedup state survived too: the first insert again is a duplicate
        with InsertClient(rp2.address, "actor-0", seq_start=1000) as ic:
            ic.insert("main", transitions(0, 0, BATCH))
            ic.flush(10)
            assert ic.duplicates == 1
        assert rp2.terminate() == 0
        assert len(snapshot_ids(tmp_path)) == 1280
    finally:
        rp.cleanup()
        if "rp2" in locals():
            rp2.cleanup()


def test_torn_wal_tail_is_ignored(tmp_path: Path) -> None:
    cfg = replay_config(capacity=1000)
    cfg.durability = "wal"
    with serving(cfg, directory=tmp_path) as server:
        with InsertClient(server.endpoint, "a") as ic:
            for b in range(3):
                ic.insert("main", transitions(0, b * 10, 10))
            ic.flush(5)
        assert server.wal is not None and server.wal.syncs >= 1
    log_files = sorted(tmp_path.glob("wal-*.log"))
    assert log_files
    # a crash mid-write: half a record at the end of the newest non-empty log file
    log_file = [s for s in log_files if s.stat().st_size > 0][-1]
    data = log_file.read_bytes()
    log_file.write_bytes(data + data[: len(data) // 3])
    (tmp_path / SNAPSHOT).unlink(missing_ok=True)
    with serving(cfg, directory=tmp_path) as server:
        t = server.tables["main"]
        assert t.size == 30
        np.testing.assert_array_equal(np.sort(t.columns["idx"][:30]), np.arange(30))


def test_queue_batch_leaves_only_after_its_pop_is_on_disk(tmp_path: Path) -> None:
    """Driven by hand (no loop thread): whenever the learner holds a batch, the log on disk holds its pop."""
    cfg = replay_config(kind="queue", capacity=100)
    cfg.durability = "wal"
    server = ReplayServer(cfg, ServiceMetrics("replay"), "tcp://127.0.0.1:0", directory=tmp_path)
    sock = make_socket(zmq.DEALER, connect=server.endpoint)

    def serve_one() -> None:
        assert server.sock.poll(10_000)
        server.handle_frames(server.sock.recv_multipart(copy=False))

    def pops_on_disk() -> int:
        return sum(h["op"] == "pop" for path in sorted(tmp_path.glob("wal-*.log")) for h, _ in read_log_file(path))

    try:
        sock.send_multipart(encode(Message("insert", {"table": "main"}, transitions(0, 0, 10), "actor", 1)))
        serve_one()
        server.tick()
        assert sock.poll(10_000) and decode(sock.recv_multipart()).type == "ack"
        sock.send_multipart(encode(Message("sample", {"table": "main", "batch_size": 4}, {}, "learner", 1)))
        serve_one()  # the burst is read; the loop would tick next
        # the pop is fsync'ed in the tick: the batch waits for it (a batch sent now would arrive
        # within the poll, and its pop, written but not fsync'ed, would already read back from the log)
        assert not sock.poll(500), "a queue batch left before the tick that fsyncs its pop"
        server.tick()
        assert sock.poll(10_000)
        batch = decode(sock.recv_multipart())
        assert batch.type == "batch" and batch.arrays["key"].tolist() == [0, 1, 2, 3]
        assert pops_on_disk() == 1
    finally:
        sock.close(linger=0)
        server.close()
    with serving(cfg, directory=tmp_path) as restored:  # the popped items are not served again
        assert restored.tables["main"].size == 6 and restored.tables["main"].oldest_key == 4


def test_a_failed_wal_fsync_stops_replay_without_acking_and_a_restart_loses_nothing(tmp_path: Path) -> None:
    """An fsync of the log fails (EIO, once; the next would succeed, as Linux's may after dropping
    the lost pages): the inserts it covered are not acked, not even by the exit path's last flush,
    their records are cut off the log, no snapshot is written from memory, the service exits 1
    saying why; restarted, it restores every acked insert, the writer's resends fill in the rest,
    each transition once."""
    sets = (TABLE, "replay.durability=wal", "replay.checkpoint_every_s=3600")
    failing = ReplayProcess(tmp_path, sets=sets, command=("harness/replay_helpers.py", "failing-fsync-replay"))
    failing.start()
    restarted = None
    try:
        failing.wait_log("running")
        client = InsertClient(failing.address, "actor-0", max_unacked=8, resend_after_s=0.5)
        for b in range(5):
            client.insert("main", transitions(0, b * BATCH, BATCH), timeout_s=30)
        client.flush(30)
        assert failing.proc is not None
        failing.proc.send_signal(signal.SIGUSR2)  # the next fsync of the log fails
        failing.wait_log("fsync armed")
        client.insert("main", transitions(0, 5 * BATCH, BATCH), timeout_s=30)
        assert failing.proc.wait(30) == 1, failing.log()
        client.poll(0.2)
        assert client.acked == 5 and client.unacked == 1, "an insert was acked after its fsync failed"
        log_text = failing.log()
        assert "replay cannot go on" in log_text and "fsync failed" in log_text, log_text
        assert "final snapshot" not in log_text and "Traceback" not in log_text, log_text
        # the record that fsync covered is cut off: a restart does not read it back from the page
        # cache (and ack its resend as a duplicate while it may not be on disk)
        log_files = sorted((tmp_path / "replay" / "shard-0").glob("wal-*.log"))
        logged = [h["seq"] for log_file in log_files for h, _ in read_log_file(log_file) if h["op"] == "insert"]
        assert len(logged) == 5, logged
        restarted = ReplayProcess(tmp_path, port=failing.port, sets=sets).start()
        restarted.wait_log("running")
        for b in range(6, 8):
            client.insert("main", transitions(0, b * BATCH, BATCH), timeout_s=30)
        client.flush(30)
        client.close()
        assert restarted.terminate() == 0
        np.testing.assert_array_equal(snapshot_ids(tmp_path), np.arange(8 * BATCH))  # all, each once
    finally:
        failing.cleanup()
        if restarted is not None:
            restarted.cleanup()


def test_an_insert_the_wal_cannot_log_is_not_stored_and_its_resend_is_stored_once(tmp_path: Path) -> None:
    """A full disk, provoked by a file size limit (RLIMIT_FSIZE) on a real server process: the
    insert whose log record does not fit is refused with ``wal_failed`` and not stored (its resend
    is refused again, not acked as a duplicate); once there is room its resend is stored once, and
    the log (the failed record cut off) restores every acked insert exactly once."""
    wal_dir = tmp_path / "wal"
    proc, endpoint = limited_wal_server(wal_dir, tmp_path / "server.log")
    sock = None
    try:
        sock = make_socket(zmq.DEALER, connect=endpoint)

        def insert(seq: int) -> Message:
            body = {"table": "main", "window_start": 1, "merge_acks": True}
            sock.send_multipart(encode(Message("insert", body, transitions(0, 100 * (seq - 1), 100), "a", seq)))
            assert sock.poll(10_000), f"no reply to insert seq {seq}"
            return decode(sock.recv_multipart())

        replies = [insert(seq) for seq in range(1, 11)]
        stored = [seq for seq, r in enumerate(replies, 1) if r.type == "ack"]
        failed = [seq for seq, r in enumerate(replies, 1) if r.type == "error"]
        assert stored == list(range(1, len(stored) + 1)) and 2 <= len(stored) < 10, [r.body for r in replies]
        assert failed == list(range(len(stored) + 1, 11))
        for r in replies[len(stored):]:
            assert r["reason"] == "wal_failed" and "nothing of it was stored" in r["detail"], r.body
        again = insert(failed[0])  # still no room: refused again, not taken for a stored duplicate
        assert again.type == "error" and again["reason"] == "wal_failed", again.body
        size = ask(endpoint, Message("info", {}))["stats"]["tables"]["main"]["size"]
        assert size == 100 * len(stored)

        proc.send_signal(signal.SIGUSR1)  # room again
        for seq in failed:
            reply = insert(seq)
            while reply.type == "error":  # until the server has handled the signal
                assert reply["reason"] == "wal_failed", reply.body
                reply = insert(seq)
            assert reply["stored"] == 100 and reply["duplicate"] is False, reply.body
        dup = insert(failed[0])
        assert dup.type == "ack" and dup["duplicate"] is True and dup["stored"] == 0
        proc.kill()
        proc.wait(10)
    finally:
        if sock is not None:
            sock.close(linger=0)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert restored_idx(wal_dir).tolist() == list(range(1000))  # each acked insert once, from the log alone


def test_insert_client_keeps_an_insert_replay_could_not_log_and_resends_it(tmp_path: Path) -> None:
    """An InsertClient answered ``wal_failed`` does not fail: the insert stays in its window and is
    resent, so the actor blocks (window full) while replay cannot log, and goes on once it can."""
    wal_dir = tmp_path / "wal"
    proc, endpoint = limited_wal_server(wal_dir, tmp_path / "server.log")
    try:
        with InsertClient(endpoint, "actor", max_unacked=4, resend_after_s=0.1, max_resend_after_s=0.2) as ic:
            for i in range(10):  # the log takes 6: the other 4 fill the window, refused again at each resend
                ic.insert("main", transitions(0, 100 * i, 100), timeout_s=5)
            with pytest.raises(CommTimeout):
                ic.insert("main", transitions(0, 1000, 100), timeout_s=1.0)  # back-pressure, not an error
            assert ic.acked == 6 and ic.unacked == 4 and ic.wal_refusals >= 4
            assert ask(endpoint, Message("info", {}))["stats"]["tables"]["main"]["size"] == 600
            proc.send_signal(signal.SIGUSR1)  # room again
            ic.flush(10)
            ic.insert("main", transitions(0, 1000, 100), timeout_s=5)
            ic.flush(10)
            assert ic.acked == 11 and ic.items_acked == 1100
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert restored_idx(wal_dir).tolist() == list(range(1100))


def test_insert_client_probes_with_one_refused_insert_and_resends_the_rest_once_it_is_stored(tmp_path: Path) -> None:
    """While replay cannot log, one refused insert is resent every ``resend_after_s`` (replay
    answers at once, nothing of it is held), the others wait on their back-off: once the disk has
    room and the probe is acked, all refused inserts go at once, in the poll that took the probe's
    ack, not after a back-off doubled for as long as the disk was full (full for 3.3 s here:
    doubled from 0.05 s, their next resend would come over 3 s after room came back). The bound
    on refusals only gets safer on a loaded machine (resends come later)."""
    wal_dir = tmp_path / "wal"
    proc, endpoint = limited_wal_server(wal_dir, tmp_path / "server.log")
    try:
        with InsertClient(endpoint, "actor", max_unacked=4, resend_after_s=0.05, max_resend_after_s=30) as ic:
            for i in range(10):  # the log takes 6, the other 4 are refused
                ic.insert("main", transitions(0, 100 * i, 100), timeout_s=5)
            full_until = time.monotonic() + 3.3
            while time.monotonic() < full_until:
                ic.poll(0.05)
            refusals = ic.wal_refusals
            assert ic.acked == 6 and ic.unacked == 4 and refusals >= 4
            # at most: the probe every 0.05 s (67) and the other three doubling from 0.05 s (7 each);
            # the whole window every 0.05 s would be ~260
            assert refusals <= 67 + 3 * 7, f"{refusals} refusals in 3.3 s: more than one insert resent steadily"
            proc.send_signal(signal.SIGUSR1)  # room again
            deadline = time.monotonic() + 30
            while ic.acked == 6:  # until the probe's ack
                assert time.monotonic() < deadline, "the probe was never acked once the disk had room"
                resends = ic.resends
                ic.poll(0.05)
            assert ic.acked == 7 and ic.resends - resends >= 3, "the other refused inserts waited for their back-off"
            ic.flush(30)
            assert ic.acked == 10 and ic.items_acked == 1000
            refusals = ic.wal_refusals  # each refusal's reply came before its insert's ack
        metrics = stopped_metrics(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    # one log line when refusals start and one when they end (not one per refused record)
    assert wal_failures(metrics, "insert") == refusals
    log_text = (tmp_path / "server.log").read_text()
    assert log_text.count("records are refused") == 1, log_text
    assert log_text.count(f"takes records again, after refusing {refusals}") == 1, log_text
    assert restored_idx(wal_dir).tolist() == list(range(1000))


def limited_wal_server(wal_dir: Path, log_path: Path, kind: str = "uniform") -> tuple[subprocess.Popen[bytes], str]:
    """harness/replay_helpers.py's wal server whose files stop growing at 6 records of 100
    transitions (57 bytes each, plus the record's header) until SIGUSR1; and its endpoint."""
    record = 100 * 57 + 300
    args = ["harness/replay_helpers.py", "limited-wal-server", str(wal_dir), str(6 * record), kind]
    proc = subprocess.Popen([PYTHON, *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=open(log_path, "wb"))
    assert proc.stdout is not None
    return proc, proc.stdout.readline().decode().strip()


def stopped_metrics(proc: subprocess.Popen[bytes]) -> str:
    """Stop a limited_wal_server (SIGTERM) and return the metrics it printed on its way out."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return out.decode()


def wal_failures(metrics: str, op: str) -> float:
    """``rlfleet_replay_wal_failures_total{op=...}`` of a Prometheus text exposition. A disk full is
    the replay's own trouble, counted there and never as a client's protocol error."""
    assert 'reason="wal_failed"' not in metrics, "a wal failure was counted as a protocol error"
    found = re.search(rf'^rlfleet_replay_wal_failures_total{{[^}}]*op="{op}"[^}}]*}} (\S+)$', metrics, re.M)
    assert found, [line for line in metrics.splitlines() if "wal_failures" in line]
    return float(found.group(1))


def restored_idx(wal_dir: Path) -> np.ndarray:
    """The sorted idx column of a wal server restored from ``wal_dir``."""
    cfg = ReplayConfig(tables=[TableConfig(name="main", kind="uniform", capacity=100_000, min_size=1)],
                       durability="wal", checkpoint_every_s=3600)
    with serving(cfg, directory=wal_dir) as server:
        table = server.tables["main"]
        return np.sort(table.columns["idx"][:table.size])


def test_a_queue_pop_the_log_refuses_leaves_the_items_queued(tmp_path: Path) -> None:
    """wal + queue: the pop is logged before items leave; a disk full at that moment answers the
    sample wal_failed (the client asks again after its back-off) and loses no item."""
    wal_dir = tmp_path / "wal"
    proc, endpoint = limited_wal_server(wal_dir, tmp_path / "server.log", kind="queue")
    try:
        with InsertClient(endpoint, "a") as ic:
            ic.insert("main", transitions(0, 0, 300))
            ic.flush(10)
        proc.send_signal(signal.SIGUSR2)  # the disk is full from now on
        with SampleClient([endpoint], "learner", "main", 100, in_flight=1, busy_backoff_s=0.2) as sc:
            with pytest.raises(CommTimeout):
                sc.sample(timeout_s=1.5)  # refused, asked again, refused...
            assert sc.busy >= 1 and proc.poll() is None  # refused, and the server lives on
            assert sc.info(0)["tables"]["main"]["size"] == 300
            proc.send_signal(signal.SIGUSR1)  # room again
            batch = sc.sample(timeout_s=10)
            assert sorted(batch.data["idx"].tolist()) == list(range(100))  # the oldest: none was lost
            stats = sc.info(0)["tables"]["main"]  # (the client asked for the next batch at once)
            assert stats["size"] + stats["sampled_items"] == 300 and stats["sampled_items"] >= 100
            refused = sc.busy  # only wal_failed answers here: at most one request in flight, none held
        metrics = stopped_metrics(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert wal_failures(metrics, "pop") == refused
