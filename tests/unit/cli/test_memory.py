"""common/memory.py: services keep freed heap memory for the next buffer instead of fresh pages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

PROBE = r"""
import ctypes, json, sys
from rlfleet.common.memory import keep_freed_memory
libc = ctypes.CDLL(None)
libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = [ctypes.c_ssize_t]
applied = keep_freed_memory() if sys.argv[1] == "tuned" else None
block = bytes(4 << 20)  # an insert payload's size: 4 MiB
in_heap = id(block) < libc.sbrk(0)
top = libc.sbrk(0)
del block
print(json.dumps({"applied": applied, "in_heap": in_heap, "kept": libc.sbrk(0) == top,
                  "again": keep_freed_memory() if applied is not None else None}))
"""


def probe(mode: str, **env: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env}, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_service_process_serves_megabyte_buffers_from_its_heap_and_keeps_them() -> None:
    default = probe("default")
    assert default["in_heap"] is False  # glibc mmaps a first 4 MiB block: fresh pages every time
    tuned = probe("tuned")
    assert tuned == {"applied": True, "in_heap": True, "kept": True, "again": True}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_the_glibc_tunables_in_the_environment_take_precedence() -> None:
    got = probe("tuned", MALLOC_MMAP_THRESHOLD_="131072")
    assert got["applied"] is False and got["in_heap"] is False
