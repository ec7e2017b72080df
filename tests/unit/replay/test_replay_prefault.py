"""Prefaulting: a table's pages are made resident ahead of its write head, never far ahead, data untouched."""

from __future__ import annotations

import ctypes
import mmap
import time

import numpy as np
import pytest

from harness.replay_helpers import replay_config, serving, transitions
from rlfleet.services.replay import prefault
from rlfleet.services.replay.prefault import Prefaulter

PAGE = mmap.PAGESIZE


def resident(col: np.ndarray, first: int, end: int) -> float:
    """Fraction of the whole pages of rows [first, end) of ``col`` that are in memory (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    base = col.ctypes.data
    start = -(-(base + first * col.strides[0]) // PAGE) * PAGE
    stop = (base + end * col.strides[0]) // PAGE * PAGE
    pages = (stop - start) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(stop - start), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec) / pages


def wait_for(cond: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)


def untouched(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Zeros in a fresh anonymous mapping: no page is resident (np.zeros may reuse heap pages)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(shape)


def test_pages_ahead_of_the_head_are_populated_and_no_further() -> None:
    rows = 1 << 20
    cols = [untouched((rows, 4), np.float32), untouched((rows,), np.int64)]  # 24 MB
    assert resident(cols[0], 0, rows) == 0.0
    pf = Prefaulter(cols, 0, "t", ahead_bytes=1 << 20)  # 1 MB ahead: 43,690 rows of 24 bytes
    try:
        if not prefault._usable:
            pytest.fail("madvise(MADV_POPULATE_WRITE) is refused on this kernel: prefaulting is off")
        wait_for(lambda: pf.done >= pf.ahead)
        assert pf.done == pf.ahead
        assert resident(cols[0], 0, pf.ahead) == 1.0
        assert resident(cols[0], 4 * pf.ahead, rows) == 0.0  # nothing far ahead
        pf.advance(100_000)  # the writer moved on: populated up to 100,000 + ahead
        wait_for(lambda: pf.done >= 100_000 + pf.ahead)
        assert pf.done == 100_000 + pf.ahead
        assert resident(cols[1], 100_000, 100_000 + pf.ahead) == 1.0
        assert resident(cols[1], 100_000 + 4 * pf.ahead, rows) == 0.0
        pf.advance(rows)  # the first lap is done: the rest is populated, then the thread ends
        wait_for(lambda: pf.finished)
        assert pf.finished and pf.done == rows
        assert not np.any(cols[0]) and not np.any(cols[1])  # populating changed no data
    finally:
        pf.close()


def test_writes_racing_the_prefaulter_are_kept() -> None:
    rows = 1 << 19
    col = np.zeros((rows, 8), np.float32)
    pf = Prefaulter([col], 0, "t", ahead_bytes=4 << 20)
    try:
        for start in range(0, rows, 1000):
            col[start:start + 1000] = np.arange(start, min(start + 1000, rows), dtype=np.float32)[:, None]
            pf.advance(min(start + 1000, rows))
        wait_for(lambda: pf.finished)
        np.testing.assert_array_equal(col[:, 3], np.arange(rows, dtype=np.float32))
    finally:
        pf.close()


def test_a_filling_table_is_prefaulted_and_its_data_intact() -> None:
    with serving(replay_config(capacity=200_000)) as server:
        from rlfleet.common.clients.replay_insert import InsertClient

        with InsertClient(server.endpoint, "a") as ic:
            for i in range(20):
                ic.insert("main", transitions(0, 100 * i, 100))
            ic.flush(10)
        table = server.tables["main"]
        pf = table._prefault
        assert pf is not None
        wait_for(lambda: pf.done >= 2000 + pf.ahead or pf.finished)
        assert resident(table.columns["obs"], 2000, min(pf.done, 200_000)) == 1.0
        np.testing.assert_array_equal(table.columns["idx"][:2000], np.arange(2000))
        assert not table.columns["idx"][2000:].any()
