"""Frame-deduplicated replay: image stacks stored as shared frames come back as the actor saw them."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
import pytest

from common.clients.replay_insert import InsertClient
from common.clients.replay_sample import SampleClient
from common.config import TableConfig
from services.replay.frames import FramePool
from services.replay.tables import make_table
from tests.replay_helpers import replay_config, serving

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
