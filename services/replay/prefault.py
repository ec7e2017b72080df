"""Pages of a table's columns made resident ahead of its write head, in a thread.

A table's columns are allocated zeroed and untouched (``np.zeros``: the
kernel maps a page at its first write). While a table fills for the first
time, every insert writes to new pages, and each first write is a page
fault: on this project's VMs, whose free memory is handed back to the host,
up to ~30 us a 4 KiB page, which was more than half of the server's time per
insert in bench.wire.replay_ingest (12.5 KB per insert of 256 CartPole items).

:class:`Prefaulter` asks the kernel to populate the pages a little ahead of
the write head (``madvise(MADV_POPULATE_WRITE)``, Linux >= 5.14) from a
background thread. The call releases the GIL (ctypes) and changes no data,
so it needs no lock with the loop that writes the columns: a page it
populates is one the writer will not fault on, a page the writer reached
first is left as it is. It never runs more than ``AHEAD_BYTES`` ahead of the
head (no memory is taken long before it is used) and stops for good once it
has reached the end of the columns: after the first lap every page is
resident. Where the call is missing (another OS, an older kernel) it does
nothing and the writes fault as before.

Fewer faults in the first place: :func:`lazy_zeros` allocates large columns
as private anonymous memory marked for transparent huge pages
(``MADV_HUGEPAGE``): still zeroed and mapped at first write, but 2 MiB at a
fault where the kernel's ``transparent_hugepage/enabled`` is ``madvise`` (the
usual default) or ``always``. ``np.zeros`` (calloc) gets no such advice: the
first write to a 49 MB CartPole table took ~97 ms in 4 KiB faults against
~4 ms in huge pages here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14)
HUGE_MIN_BYTES = 4 << 20  # smaller arrays: np.zeros
AHEAD_BYTES = 32 << 20  # all columns of a table together
_PAGE = mmap.PAGESIZE

_madvise: Any = None
_usable = sys.platform.startswith("linux")


def _populate(start: int, end: int) -> bool:
    """madvise(POPULATE_WRITE) over [start, end) (page-aligned addresses); False if unsupported."""
    global _madvise, _usable
    if _madvise is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            _madvise = libc.madvise
            _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _madvise.restype = ctypes.c_int
        except (OSError, AttributeError):
            _usable = False
            return False
    if _madvise(start, end - start, MADV_POPULATE_WRITE) != 0:
        err = ctypes.get_errno()
        log.info("replay: page prefaulting off (madvise POPULATE_WRITE failed, errno %d)", err)
        _usable = False
        return False
    return True


def lazy_zeros(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Like ``np.zeros``; an array of at least ``HUGE_MIN_BYTES`` is private anonymous memory advised
    to use transparent huge pages (zeroed, mapped at first write, 2 MiB at a fault where the kernel allows)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_MIN_BYTES or advice is None:
        return np.zeros(shape, dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(advice)
    except OSError:  # a kernel without THP: 4 KiB pages, as np.zeros
        pass
    return np.frombuffer(buf, dtype).reshape(shape)


class Prefaulter:
    """Keeps the pages of ``columns`` (equal length, item 0 first) resident up to
    ``AHEAD_BYTES`` past the write head; :meth:`advance` after every write."""

    def __init__(self, columns: Sequence[np.ndarray], head: int, name: str = "",
                 ahead_bytes: int = AHEAD_BYTES) -> None:
        self.columns = [c for c in columns if c.flags.c_contiguous and c.ndim >= 1 and len(c)]
        self.capacity = min((len(c) for c in self.columns), default=0)
        row_bytes = sum(c.strides[0] for c in self.columns) or 1
        self.ahead = max(1, ahead_bytes // row_bytes)  # items
        self.done = head  # items [.., done) are populated (or were written already)
        self.wanted = min(self.capacity, head + self.ahead)
        self.finished = not _usable or not self.columns or self.done >= self.capacity
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        if not self.finished:
            self._thread = threading.Thread(target=self._run, name=f"replay-prefault-{name}", daemon=True)
            self._thread.start()
            self._wake.set()

    def advance(self, head: int) -> None:
        """The writer is at item ``head`` (keys count up; a head past the end is the first lap done)."""
        if self.finished or head + self.ahead // 2 < self.wanted:
            return
        self.wanted = min(self.capacity, head + self.ahead)
        self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            target = self.wanted
            if self._closed or target <= self.done:
                continue
            for col in self.columns:
                if not self._range(col, self.done, target):
                    self.finished = True
                    return
            self.done = target
            if target >= self.capacity:
                self.finished = True
                return

    @staticmethod
    def _range(col: np.ndarray, first: int, end: int) -> bool:
        """Populate the whole pages of rows [first, end) that lie inside ``col``'s buffer."""
        base = col.ctypes.data
        lo = -(-base // _PAGE) * _PAGE  # pages partly outside the buffer are left to the writer
        hi = (base + col.nbytes) // _PAGE * _PAGE
        start = max(lo, (base + first * col.strides[0]) // _PAGE * _PAGE)
        stop = min(hi, -(-(base + end * col.strides[0]) // _PAGE) * _PAGE)
        return start >= stop or _populate(start, stop)

    def close(self) -> None:
        self._closed = True
        self.finished = True
        self._wake.set()
