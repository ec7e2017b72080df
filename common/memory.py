"""How the C allocator treats the large, short-lived buffers every service makes.

An insert's payload (0.5-4 MB of packed frames), ZeroMQ's copy of each
message received, a sampled batch: each is allocated, filled once and freed
within milliseconds. glibc serves blocks of this size from fresh ``mmap``
pages or hands freed heap memory back to the kernel once 2x the block is
free at the heap's top, so the next buffer lands on pages the kernel must
find and zero again: on a VM that backs each guest page on first touch
(balloon free page reporting) writing fresh memory ran at 0.5-0.8 GB/s
against 35 GB/s to memory written before (bench.wire.replay_ingest's
``memory``), and copying an actor's 560 KB insert payload into a ZeroMQ message
took ~0.5 ms.

:func:`keep_freed_memory` raises both thresholds so such buffers reuse heap
memory the process already has: up to ``trim_threshold`` bytes of free heap
stay with the process (per malloc arena), blocks up to ``mmap_threshold``
come from the heap. Bigger arrays (replay's tables, a model's weights) are
mmapped as before. Every service sets it at start (common/runtime.py); the
glibc tunables ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` in the
environment take precedence, and another C library is left alone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 16 << 20  # glibc's own ceiling for its dynamic threshold is 32 MiB on 64-bit
TRIM_THRESHOLD = 64 << 20

_applied: bool | None = None


def keep_freed_memory(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Set glibc's mmap and trim thresholds once per process; True if they are set (now or before)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux") or any(k in os.environ for k in (
            "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no mallopt: not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 and mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1
    if not _applied:  # musl's mallopt is a stub that returns 0
        log.debug("mallopt refused the thresholds: the C library's defaults stay")
    return _applied
