"""The readers' side (and a shard taking a publish): map a file named in a message, trusting nothing in it."""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import stat
from typing import Any

import numpy as np

from rlfleet.common.weights_shm.files import ALIGN, NAME, PREFIX, PUBLISHED, SHM_DIR
from rlfleet.common.wire.codec import DTYPES


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
        if not isinstance(p, str) or not NAME.match(p) or ".." in p:
            raise ValueError(f"weights.shm.{key} names a path outside {SHM_DIR}/{PREFIX}*: {p!r}")
    path, probe, items = str(desc["path"]), str(desc["probe"]), desc.get("arrays")
    if not isinstance(items, list):
        raise ValueError("weights.shm.arrays must be a list")
    try:
        mm, size = _open_mapped(path)
    except FileNotFoundError:
        if _ours(probe):
            raise ShmGone(path) from None
        raise ShmUnavailable(f"{path} does not exist here (another host or container)") from None
    return _arrays("weights.shm", items, mm, size)


def map_published(desc: Any) -> tuple[str, list[list[Any]], dict[str, np.ndarray]]:
    """(path, descriptors, read-only arrays) of a ``publish.shm`` field. Trusts nothing in it.

    Raises ValueError for a malformed field and ShmUnavailable for a file this
    process cannot see or must not trust (another host, a symlink, another
    user's file, or one that is not a publisher's).
    """
    if not isinstance(desc, dict):
        raise ValueError("publish.shm must be a map")
    path, items = desc.get("path"), desc.get("arrays")
    if not isinstance(path, str) or not PUBLISHED.match(path):
        raise ValueError(f"publish.shm.path must name a publisher's file {SHM_DIR}/{PREFIX}<pid>-<token>-pub<n>: "
                         f"{path!r}")
    if not isinstance(items, list):
        raise ValueError("publish.shm.arrays must be a list")
    try:
        mm, size = _open_mapped(path)
    except FileNotFoundError:
        raise ShmUnavailable(f"{path} does not exist here (another host or container)") from None
    except ShmGone as exc:  # nobody reclaims a publisher's file: not what the publisher meant
        raise ValueError(f"publish.shm.path: {exc}") from None
    arrays = _arrays("publish.shm", items, mm, size)
    descriptors = [[str(n), str(d), [int(x) for x in s], int(o)] for n, d, s, o in items]
    return path, descriptors, arrays


def _open_mapped(path: str) -> tuple[mmap.mmap | None, int]:
    """A read-only map of ``path`` and its size; raises FileNotFoundError, ShmGone or ShmUnavailable.

    The map holds a shared flock on the file for as long as it lives (the lock
    belongs to the open file, which the mapping keeps), so no shard reuses the
    file under it; the name is checked after locking, since a shard renames a
    file it reclaims while it holds the exclusive lock.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: a symlink; EACCES: another user's file
        raise ShmUnavailable(f"{path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise ShmUnavailable(f"{path} is not a regular file owned by uid {os.getuid()}")
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ShmGone(f"{path} is being reclaimed") from None
        try:
            now = os.lstat(path)
        except FileNotFoundError:
            raise ShmGone(f"{path} was reclaimed") from None
        if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
            raise ShmGone(f"{path} was reclaimed")
        size = st.st_size
        return (mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None), size
    finally:
        os.close(fd)  # a map keeps the open file (and its lock) through its own descriptor


def _arrays(field: str, items: list[Any], mm: mmap.mmap | None, size: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for item in items:
        if not (isinstance(item, list) and len(item) == 4):
            raise ValueError(f"each {field}.arrays item must be [name, dtype, shape, offset]")
        name, dtype, shape, offset = item
        if not isinstance(name, str) or name in out or not isinstance(dtype, str) or dtype not in DTYPES:
            raise ValueError(f"{field} array {name!r}: bad name or dtype {dtype!r}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and 0 <= d < 1 << 40 for d in shape)):
            raise ValueError(f"{field} array {name!r}: bad shape")
        count = math.prod(shape)
        nbytes = count * DTYPES[dtype].itemsize
        if not isinstance(offset, int) or offset < 0 or offset % ALIGN or offset + nbytes > size:
            raise ValueError(f"{field} array {name!r}: offset {offset!r} outside the {size}-byte file")
        if count == 0 or mm is None:
            out[name] = np.zeros(shape, DTYPES[dtype])
            out[name].flags.writeable = False
        else:
            out[name] = np.frombuffer(mm, DTYPES[dtype], count, offset).reshape(shape)
    return out
