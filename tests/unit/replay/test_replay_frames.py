"""Frame-deduplicated replay: image stacks stored as shared frames come back as the actor saw them."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
import pytest

from harness.replay_helpers import replay_config, serving
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.config import TableConfig
from rlfleet.common.wire.errors import RemoteError
from rlfleet.common.wire.frames import FRAMES, FrameIndex, frame_hashes, pack_frames, unpack_frames
from rlfleet.services.replay.frames import FramePool
from rlfleet.services.replay.tables import make_table

STACK, SIDE, N_STEP = 4, 12, 3


def atari_like_transitions(count: int, envs: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Transitions as the actors make them from stacked frames: several envs interleaved, episodes of
    random lengths whose first stack repeats the reset frame (FrameStackObservation's padding), n-step
    next_obs; each frame random, so a wrong frame anywhere shows."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, np.ndarray]] = []
    stacks: list[deque[np.ndarray]] = []
    history: list[list[np.ndarray]] = []
    left = []
    for _ in range(envs):
        first = rng.integers(0, 256, (SIDE, SIDE), np.uint8)
        stacks.append(deque([first] * STACK, maxlen=STACK))
        history.append([np.stack(stacks[-1])])
        left.append(int(rng.integers(2, 30)))
    while len(out) < count:
        for e in range(envs):
            stacks[e].append(rng.integers(0, 256, (SIDE, SIDE), np.uint8))
            history[e].append(np.stack(stacks[e]))
            left[e] -= 1
            h = history[e]
            if len(h) > N_STEP:  # the transition that now has its n-th next observation
                out.append({"obs": h[-N_STEP - 1], "next_obs": h[-1], "action": np.int64(len(out))})
            if left[e] == 0:  # episode over: the tail transitions, then a reset padded with its frame
                for k in range(max(0, len(h) - N_STEP), len(h) - 1):
                    out.append({"obs": h[k], "next_obs": h[-1], "action": np.int64(len(out))})
                first = rng.integers(0, 256, (SIDE, SIDE), np.uint8)
                stacks[e] = deque([first] * STACK, maxlen=STACK)
                history[e] = [np.stack(stacks[e])]
                left[e] = int(rng.integers(2, 30))
    return out[:count]


def batch(items: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([t[k] for t in items]) for k in ("obs", "action", "next_obs")}


def check_sampled(table, items: list[dict[str, np.ndarray]]) -> None:
    s = table.sample(512)
    assert s.data["obs"].dtype == np.uint8 and s.data["obs"].shape == (512, STACK, SIDE, SIDE)
    for key, obs, nxt, act in zip(s.keys, s.data["obs"], s.data["next_obs"], s.data["action"], strict=True):
        want = items[int(key)]
        assert int(act) == int(want["action"]) == int(key)
        np.testing.assert_array_equal(obs, want["obs"])
        np.testing.assert_array_equal(nxt, want["next_obs"])


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_stacks_sampled_are_the_stacks_inserted_across_resets_and_ring_wraparound(kind: str) -> None:
    items = atari_like_transitions(3000, envs=3, seed=1)
    table = make_table(TableConfig(kind=kind, capacity=700, min_size=1), np.random.default_rng(0))
    for lo in range(0, len(items), 37):  # 37: inserts straddle the end of the ring
        table.insert(batch(items[lo:lo + 37]))
    assert table.frames is not None and table.frames.names == ["obs", "next_obs"]
    assert table.size == 700 and table.next_key == 3000
    check_sampled(table, items)
    # only the frames the live items use are held: each frame of theirs exactly once
    live = range(3000 - 700, 3000)
    used = {items[k][c][i].tobytes() for k in live for c in ("obs", "next_obs") for i in range(STACK)}
    assert table.frames.pool.live == len(used)
    naive = 2 * STACK * SIDE * SIDE
    assert table.bytes_per_item() < naive / 3.5


def test_a_snapshot_keeps_each_frame_once_and_restores_the_same_stacks() -> None:
    items = atari_like_transitions(1200, envs=2, seed=2)
    cfg = TableConfig(kind="prioritized", capacity=1000, min_size=1)
    table = make_table(cfg, np.random.default_rng(0))
    for lo in range(0, len(items), 50):
        table.insert(batch(items[lo:lo + 50]))
    meta, arrays = table.state()
    assert arrays["__frames__"].shape[0] == table.frames.pool.live  # each frame once in the snapshot
    assert arrays["obs"].dtype == np.int32
    for restored_cfg in (cfg, TableConfig(kind="prioritized", capacity=600, min_size=1)):  # also shrunk
        again = make_table(restored_cfg, np.random.default_rng(1))
        assert again.restore(meta, arrays) == min(1000, restored_cfg.capacity)
        check_sampled(again, items)
        again.insert(batch(items[:10]))  # and goes on taking inserts (keys 1200.., items of keys 0..9)
    plain = make_table(TableConfig(kind="prioritized", capacity=1000, min_size=1, frames="off"))
    plain.restore(meta, arrays)  # a table that keeps whole stacks takes the snapshot too
    assert plain.frames is None
    check_sampled(plain, items)


def test_queue_tables_and_frames_off_keep_their_own_stacks() -> None:
    items = atari_like_transitions(100, envs=1, seed=3)
    for cfg in (TableConfig(kind="queue", capacity=200, min_size=1), TableConfig(kind="uniform", frames="off")):
        table = make_table(cfg)
        table.insert(batch(items))
        assert table.frames is None and table.columns["obs"].shape[1:] == (STACK, SIDE, SIDE)


def test_the_pool_frees_frames_no_item_uses_and_reuses_their_slots() -> None:
    pool = FramePool((SIDE, SIDE), np.dtype(np.uint8), initial=4)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (3, STACK, SIDE, SIDE), np.uint8)
    refs = pool.intern(a)
    assert pool.live == 12 and len(pool.frames) >= 12  # grew past its first 4 slots
    again = pool.intern(a[:1])  # the same frames: no new ones
    assert pool.live == 12 and (again == refs[:1]).all()
    pool.release(refs)
    assert pool.live == 4  # the first stack is still referenced once
    pool.release(again)
    assert pool.live == 0
    pool.intern(a[2:])
    assert pool.live == 4 and pool._top == 12  # freed slots reused, none new


def test_uint8_stacks_over_real_sockets_and_a_restart_from_the_log(tmp_path: Path) -> None:
    items = atari_like_transitions(600, envs=2, seed=4)
    cfg = replay_config(kind="prioritized", capacity=500)
    cfg = cfg.model_copy(update={"durability": "wal"})
    with serving(cfg, tmp_path) as server:
        with InsertClient(server.endpoint, "actor-0") as ic:
            for lo in range(0, 600, 40):
                ic.insert("main", batch(items[lo:lo + 40]))
            ic.flush(10)
        with SampleClient([server.endpoint], "learner", "main", 256, in_flight=1) as sc:
            got = sc.sample(timeout_s=10)
            stats = sc.info()["tables"]["main"]
        port = server.endpoint.rsplit(":", 1)[1]
    assert got.data["obs"].dtype == np.uint8
    for key, obs, nxt in zip(got.keys, got.data["obs"], got.data["next_obs"], strict=True):
        np.testing.assert_array_equal(obs, items[int(key)]["obs"])
        np.testing.assert_array_equal(nxt, items[int(key)]["next_obs"])
    assert stats["frame_columns"] == ["obs", "next_obs"] and stats["frames_stored"] > 0
    assert stats["bytes_per_item"] < 2 * STACK * SIDE * SIDE / 3.5
    with serving(cfg, tmp_path, bind=f"tcp://127.0.0.1:{port}") as server:  # restored from the log
        table = server.tables["main"]
        assert table.size == 500
        check_sampled(table, items)


def test_packed_inserts_send_each_frame_once_and_unpack_to_the_same_stacks() -> None:
    cols = batch(atari_like_transitions(64, envs=2, seed=5))
    packed = pack_frames(cols)
    assert list(packed) == ["obs@frames", "action", "next_obs@frames", FRAMES]  # frames last
    distinct = {f.tobytes() for c in ("obs", "next_obs") for f in cols[c].reshape(-1, SIDE, SIDE)}
    assert len(packed[FRAMES]) == len(distinct)
    assert sum(a.nbytes for a in packed.values()) < sum(a.nbytes for a in cols.values()) / 3
    again = unpack_frames(packed)
    assert again.keys() == cols.keys()
    for k in cols:
        np.testing.assert_array_equal(again[k], cols[k])
    for cfg in (TableConfig(kind="uniform", min_size=1), TableConfig(kind="queue", min_size=1),
                TableConfig(kind="uniform", min_size=1, frames="off")):
        table = make_table(cfg)
        assert table.check(packed) == 64
        table.insert(packed)
        s = table.sample(64)
        for key, obs in zip(s.keys, s.data["obs"], strict=True):
            np.testing.assert_array_equal(obs, cols["obs"][int(key)])


def test_a_frame_index_shares_a_slot_only_for_equal_bytes() -> None:
    index = FrameIndex()
    rows = [np.zeros(16, np.uint8), np.ones(16, np.uint8)]
    index.add(7, 0)  # the same checksum for two different frames: a collision
    assert index.find(7, rows[1], rows.__getitem__) is None
    index.add(7, 1)
    assert index.find(7, rows[1], rows.__getitem__) == 1 and index.find(7, rows[0], rows.__getitem__) == 0
    index.remove(7, 0)
    assert index.find(7, rows[0], rows.__getitem__) is None and index.find(7, rows[1], rows.__getitem__) == 1


def bad_packed(case: str, good: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    bad = dict(good)
    if case == "index_out_of_range":
        bad["obs@frames"] = good["obs@frames"] + len(good[FRAMES])
    elif case == "negative_index":
        bad["obs@frames"] = good["obs@frames"] - 1000
    elif case == "frames_not_uint8":
        bad[FRAMES] = good[FRAMES].astype(np.float32)
    elif case == "indices_not_int32":
        bad["obs@frames"] = good["obs@frames"].astype(np.int64)
    elif case == "no_packed_column":
        bad = {"obs": unpack_frames(good)["obs"], "action": good["action"],
               "next_obs": unpack_frames(good)["next_obs"], FRAMES: good[FRAMES]}
    elif case == "stack_of_the_wrong_depth":
        bad["obs@frames"] = good["obs@frames"][:, :2]
    return bad


def test_bad_packed_inserts_are_refused_with_the_reason_and_lose_nothing(tmp_path: Path) -> None:
    good = [pack_frames(batch(part)) for part in chunks_of(atari_like_transitions(128, envs=2, seed=6), 64)]
    with serving(replay_config(kind="prioritized", capacity=500), tmp_path) as server:
        with InsertClient(server.endpoint, "actor-0", pack_frames=False) as ic:
            ic.insert("main", good[0])
            ic.flush(10)
        for case in ("index_out_of_range", "negative_index", "frames_not_uint8", "indices_not_int32",
                     "no_packed_column", "stack_of_the_wrong_depth"):
            with InsertClient(server.endpoint, f"bad-{case}", pack_frames=False) as ic:
                ic.insert("main", bad_packed(case, good[1]))
                with pytest.raises(RemoteError) as err:
                    ic.flush(10)
            assert err.value.reason in ("bad_frames", "schema_mismatch"), (case, err.value)
        with InsertClient(server.endpoint, "actor-1", pack_frames=False) as ic:
            ic.insert("main", good[1])
            ic.flush(10)
        table = server.tables["main"]
        assert table.size == 128  # both good inserts, nothing of the bad ones
        s = table.sample(128)
        want = unpack_frames(good[0]), unpack_frames(good[1])
        for key, obs in zip(s.keys, s.data["obs"], strict=True):
            np.testing.assert_array_equal(obs, want[int(key) // 64]["obs"][int(key) % 64])


def chunks_of(items: list[dict[str, np.ndarray]], size: int) -> list[list[dict[str, np.ndarray]]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def test_frames_in_bulk_never_share_a_slot_on_a_checksum_alone() -> None:
    pool = FramePool((SIDE, SIDE), np.dtype(np.uint8), initial=2)
    rng = np.random.default_rng(7)
    a, b = rng.integers(0, 256, (2, SIDE, SIDE), np.uint8)
    slot_a = int(pool.intern_distinct(a[None])[0])
    pool._index.add_new(frame_hashes(b.reshape(1, -1)), [slot_a])  # a collision: b's hash already names a's slot
    slot_b = int(pool.intern_distinct(b[None])[0])
    assert slot_b != slot_a
    np.testing.assert_array_equal(pool.frames[slot_b], b)
    twice = pool.intern_distinct(np.stack([a, a, b]))  # "distinct" frames that are not: still exact
    assert twice.tolist() == [slot_a, slot_a, slot_b]
    assert pool.refs[slot_a] == 3 and pool.refs[slot_b] == 2
    fresh = pool.intern_distinct(rng.integers(0, 256, (40, SIDE, SIDE), np.uint8))  # grows past its slots
    assert len(set(fresh.tolist())) == 40 and pool.live == 42


def test_frame_hashes_tell_apart_frames_one_byte_apart_of_any_width() -> None:
    rng = np.random.default_rng(11)
    for width in (7056, 64, 67):  # 84 x 84, and rows that are not whole 64-bit words
        rows = rng.integers(0, 256, (50, width), np.uint8)
        near = rows.copy()
        near[np.arange(50), rng.integers(0, width, 50)] ^= 1  # each row with one bit flipped
        hashes = frame_hashes(np.concatenate([rows, near, rows]))
        assert hashes[100:] == hashes[:50]  # equal bytes, equal hashes
        assert len(set(hashes[:100])) == 100
        assert all(0 <= h < 1 << 63 for h in hashes)


def test_a_packed_frame_no_item_uses_is_not_kept() -> None:
    pool = FramePool((SIDE, SIDE), np.dtype(np.uint8), initial=4)
    frames = np.random.default_rng(3).integers(0, 256, (3, SIDE, SIDE), np.uint8)
    obs = np.array([[0, 0], [2, 0]], np.int32)  # frame 1 is sent but unused
    refs = pool.load(frames, [obs])[0]
    assert pool.live == 2 and pool.refs[refs[0, 0]] == 3 and pool.refs[refs[1, 0]] == 1
    np.testing.assert_array_equal(pool.gather(refs), frames[obs])
    pool.release(refs.ravel())
    assert pool.live == 0
