"""Same-host fast path: readers map a version from shared memory instead of receiving it.

With many actors on the paramserver's host, sending every actor its own copy
over loopback tcp costs one kernel copy per actor per version. A reader that
says ``shm: true`` in ``get``/``wait`` instead gets a ``weights`` reply without
payload frames whose ``shm`` field names a file in /dev/shm holding that
version's arrays (written once per version, on first demand, then immutable);
the reader maps it read-only. This is what Ray's object store does for readers
on the same node.

Safety: file names carry the server's pid and a random 128-bit token, are
created with O_EXCL and mode 0600, and a reader maps only paths of the form
``/dev/shm/rlfleet-ps-<name>`` whose size covers every array, opened with
O_NOFOLLOW, and only a regular file owned by the reader's own uid (/dev/shm is
world-writable: anyone could plant a symlink or a file of theirs there). A
file that fails those checks is treated like one the reader cannot see:
frames for that shard. A reader whose
/dev/shm is not the server's (another host or container) cannot open the
probe file named in the reply and falls back to frames for that shard.
A shard unlinks a version's file when it drops the version; readers that
mapped it keep their memory until they let go of the arrays.
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import os
import re
import secrets
import stat
from collections.abc import Mapping
from typing import Any

import numpy as np

from common.protocol import DTYPES, wire_dtype_name

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PREFIX = "rlfleet-ps-"
ALIGN = 64
_NAME = re.compile(r"^/dev/shm/rlfleet-ps-[A-Za-z0-9_.-]{1,200}$")


def available() -> bool:
    return os.name == "posix" and os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale() -> int:
    """Remove our files left by paramserver processes that are gone (a crash or SIGKILL)."""
    removed = 0
    for name in os.listdir(SHM_DIR):
        m = re.match(rf"^{PREFIX}(\d+)-", name)
        path = os.path.join(SHM_DIR, name)
        if m and not _pid_alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                if os.lstat(path).st_uid == os.getuid():
                    os.unlink(path)
                    removed += 1
    return removed


class ShmExporter:
    """Server side: one file per exported version; the probe file lives as long as the server."""

    def __init__(self, shard: int, directory: str = SHM_DIR) -> None:
        if directory == SHM_DIR:
            clean_stale()
        self.base = f"{directory}/{PREFIX}{os.getpid()}-{secrets.token_hex(16)}-s{shard}"
        self.probe = f"{self.base}-probe"
        fd = os.open(self.probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        self.files: dict[int, tuple[str, list[list[Any]]]] = {}  # version -> (path, descriptors)
        # A file of the last version's size with its pages already allocated, so that
        # exporting the next version is one copy, not a copy plus page faults.
        self.spare: tuple[str, int] | None = None
        self.last_size = 0
        self._count = 0

    def export(self, version: int, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """The ``weights.shm`` field for ``version`` (written on first call)."""
        if version not in self.files:
            self.files[version] = self._write(version, arrays)
        path, descriptors = self.files[version]
        return {"path": path, "probe": self.probe, "arrays": descriptors}

    def _write(self, version: int, arrays: Mapping[str, np.ndarray]) -> tuple[str, list[list[Any]]]:
        descriptors: list[list[Any]] = []
        offset = 0
        for name, arr in arrays.items():
            descriptors.append([name, wire_dtype_name(arr.dtype), list(arr.shape), offset])
            offset += -(-arr.nbytes // ALIGN) * ALIGN
        size = self.last_size = max(offset, 1)
        path = f"{self.base}-v{version}"
        if self.spare is not None and self.spare[1] == size:
            os.rename(self.spare[0], path)  # never read by anyone: its name was never sent
            self.spare = None
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        else:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, size)
        try:
            for (_, _, _, start), arr in zip(descriptors, arrays.values(), strict=True):
                view = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
                done = 0
                while done < len(view):
                    done += os.pwrite(fd, view[done:], start + done)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return path, descriptors

    def prepare_spare(self) -> None:
        """Allocate the next version's file ahead of time (call when idle)."""
        if self.spare is not None or not self.last_size:
            return
        self._count += 1
        path = f"{self.base}-spare{self._count}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, self.last_size)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, self.last_size)
        except OSError:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        self.spare = (path, self.last_size)

    def drop(self, version: int) -> None:
        entry = self.files.pop(version, None)
        if entry is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry[0])

    def close(self) -> None:
        for version in list(self.files):
            self.drop(version)
        if self.spare is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.spare[0])
            self.spare = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.probe)


class ShmUnavailable(Exception):
    """This reader cannot see the server's /dev/shm (or must not trust the file there): use frames."""


class ShmGone(Exception):
    """The version's file is gone (the shard dropped it): ask again."""


def _ours(path: str) -> bool:
    """``path`` is a regular file (not a symlink) owned by this process's uid."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


def map_arrays(desc: Any) -> dict[str, np.ndarray]:
    """Read-only arrays mapped from a ``weights.shm`` field. Trusts nothing in it."""
    if not isinstance(desc, dict):
        raise ValueError("weights.shm must be a map")
    for key in ("path", "probe"):
        p = desc.get(key)
        if not isinstance(p, str) or not _NAME.match(p) or ".." in p:
            raise ValueError(f"weights.shm.{key} names a path outside {SHM_DIR}/{PREFIX}*: {p!r}")
    path, probe, items = str(desc["path"]), str(desc["probe"]), desc.get("arrays")
    if not isinstance(items, list):
        raise ValueError("weights.shm.arrays must be a list")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        if _ours(probe):
            raise ShmGone(path) from None
        raise ShmUnavailable(f"{path} does not exist here (another host or container)") from None
    except OSError as exc:  # ELOOP: a symlink; EACCES: another user's file
        raise ShmUnavailable(f"{path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise ShmUnavailable(f"{path} is not a regular file owned by uid {os.getuid()}")
        size = st.st_size
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None
    finally:
        os.close(fd)
    out: dict[str, np.ndarray] = {}
    for item in items:
        if not (isinstance(item, list) and len(item) == 4):
            raise ValueError("each weights.shm.arrays item must be [name, dtype, shape, offset]")
        name, dtype, shape, offset = item
        if not isinstance(name, str) or name in out or not isinstance(dtype, str) or dtype not in DTYPES:
            raise ValueError(f"weights.shm array {name!r}: bad name or dtype {dtype!r}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and 0 <= d < 1 << 40 for d in shape)):
            raise ValueError(f"weights.shm array {name!r}: bad shape")
        count = math.prod(shape)
        nbytes = count * DTYPES[dtype].itemsize
        if not isinstance(offset, int) or offset < 0 or offset % ALIGN or offset + nbytes > size:
            raise ValueError(f"weights.shm array {name!r}: offset {offset!r} outside the {size}-byte file")
        if count == 0 or mm is None:
            out[name] = np.zeros(shape, DTYPES[dtype])
            out[name].flags.writeable = False
        else:
            out[name] = np.frombuffer(mm, DTYPES[dtype], count, offset).reshape(shape)
    return out
