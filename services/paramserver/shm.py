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
A reader holds a shared flock on a file for as long as it maps it (the lock
belongs to the open file, which the mapping keeps open), taken before it
maps and followed by a check that the name still leads to that file.

Pages are recycled rather than allocated and freed per version: on this
kind of host allocating a file's pages and freeing them costs about 1 ms per
MB each, more than the copy itself. When a shard drops a version it retires
the file; once it can take an exclusive flock (no reader maps it any more)
it renames it to a free name and reuses it, or, for a file the publisher
wrote, hands it back in ``publish_ack.free`` for the publisher's next slice.
A file that readers keep mapped stays retired (at most ``MAX_RETIRED``, then
the oldest is unlinked: its pages go when the last reader lets go).

The publisher on the shards' host does the same in the other direction
(:class:`ShmWriter`): it writes each shard's slice once into a file of its
own (``...-pub<n>``, pages allocated ahead of time) and sends only its name;
the shard maps it, checks it like any publish and takes the file over as that
version's file (a rename), so the bytes are copied once from the learner to
every same-host reader, instead of once over tcp to the shard and once more
into /dev/shm.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
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
#: retired files (dropped versions a reader may still map) kept for reuse before the oldest is unlinked
MAX_RETIRED = 4
#: free files (no reader maps them) kept for reuse
MAX_FREE = 2
PREFIX = "rlfleet-ps-"
ALIGN = 64
_NAME = re.compile(r"^/dev/shm/rlfleet-ps-[A-Za-z0-9_.-]{1,200}$")
# A publisher's file (pid, token, counter): the only kind a shard takes over, so a
# publish cannot name (and make a shard rename) a file another shard serves.
_PUBLISHED = re.compile(r"^/dev/shm/rlfleet-ps-\d+-[0-9a-f]{32}-pub\d+$")


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
        self.retired: list[str] = []  # files of dropped versions, oldest first, maybe still mapped
        self.free: list[tuple[str, int]] = []  # (path, size): reclaimed files no reader maps
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
        descriptors, size = layout_of(arrays)
        self.last_size = size
        path = f"{self.base}-v{version}"
        if self.spare is None or self.spare[1] != size:
            reused = self.take_free(size)
            if reused is not None:
                if self.spare is not None:
                    discard(self.spare[0])
                self.spare = (reused, size)
        if self.spare is not None and self.spare[1] == size:
            os.rename(self.spare[0], path)  # no reader maps it: its name was never sent, or it was reclaimed
            self.spare = None
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        else:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, size)
        _fill(fd, path, descriptors, arrays)
        return path, descriptors

    def adopt(self, version: int, path: str, descriptors: list[list[Any]]) -> bool:
        """Take over a publisher's file (already mapped and checked) as ``version``'s file.

        False when it cannot be renamed into this shard's names (e.g. the
        publisher gave up and removed it): the file is removed and readers get
        the version exported on demand, as for a publish that came as frames.
        """
        mine = f"{self.base}-v{version}"
        try:
            os.rename(path, mine)
        except OSError as exc:
            log.debug("could not take over %s as %s: %s", path, mine, exc)
            with contextlib.suppress(OSError):
                os.unlink(path)
            return False
        self.files[version] = (mine, descriptors)
        return True

    def prepare_spare(self) -> None:
        """Have the next version's file ready ahead of time (call when idle): a reclaimed one or a new one."""
        if self.spare is not None or not self.last_size:
            return
        reused = self.take_free(self.last_size)
        if reused is not None:
            self.spare = (reused, self.last_size)
            return
        self._count += 1
        path = f"{self.base}-spare{self._count}"
        _allocate(path, self.last_size)
        self.spare = (path, self.last_size)

    def drop(self, version: int) -> None:
        """Retire ``version``'s file: reused once no reader maps it (see reclaim)."""
        entry = self.files.pop(version, None)
        if entry is not None:
            self.retired.append(entry[0])
            while len(self.retired) > MAX_RETIRED:  # readers keep them: let their pages go with the readers
                discard(self.retired.pop(0))

    def reclaim(self) -> None:
        """Move the retired files no reader maps any more to the free list (renamed, so none can map them)."""
        still: list[str] = []
        for path in self.retired:
            self._count += 1
            got = reclaim(path, f"{self.base}-free{self._count}")
            if got is None:
                still.append(path)
            elif got[0]:
                self.free.append(got)
        self.retired = still
        while len(self.free) > MAX_FREE:
            discard(self.free.pop(0)[0])

    def take_free(self, size: int | None = None) -> str | None:
        """A reclaimed file (of ``size`` bytes, if given) to write again, or None."""
        for k, (path, n) in enumerate(self.free):
            if size is None or n == size:
                del self.free[k]
                return path
        return None

    def close(self) -> None:
        for version in list(self.files):
            self.drop(version)
        for path in [*self.retired, *(p for p, _ in self.free)]:
            discard(path)
        self.retired.clear()
        self.free.clear()
        if self.spare is not None:
            discard(self.spare[0])
            self.spare = None
        discard(self.probe)


def layout_of(arrays: Mapping[str, np.ndarray]) -> tuple[list[list[Any]], int]:
    """[name, dtype, shape, offset] per array (offsets aligned) and the file size they need."""
    descriptors: list[list[Any]] = []
    offset = 0
    for name, arr in arrays.items():
        descriptors.append([name, wire_dtype_name(arr.dtype), list(arr.shape), offset])
        offset += -(-arr.nbytes // ALIGN) * ALIGN
    return descriptors, max(offset, 1)


def discard(path: str) -> None:
    """Remove a /dev/shm file if it is still there."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def reclaim(path: str, new_path: str) -> tuple[str, int] | None:
    """Rename ``path`` to ``new_path`` if no process maps it; returns (new_path, size).

    None while some reader holds its shared lock (it maps the file). A file
    that is gone, or cannot be locked or renamed, is unlinked and reported as
    ("", 0): nothing to reuse. The exclusive lock is held across the rename, so
    a reader that opened the old name before cannot map it afterwards: its
    check that the name still leads to its file fails.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        discard(path)
        return "", 0
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        try:
            st = os.fstat(fd)
            os.rename(path, new_path)
        except OSError:
            discard(path)
            return "", 0
        return new_path, st.st_size
    finally:
        os.close(fd)  # drops the lock


def _allocate(path: str, size: int) -> None:
    """A new file of ``size`` bytes whose pages are allocated now, not on first write."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
    except OSError:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


def _fill(fd: int, path: str, descriptors: list[list[Any]], arrays: Mapping[str, np.ndarray]) -> None:
    """Write the arrays at their offsets and close ``fd``; on failure remove ``path``.

    pwrite rather than a memory map: into a file whose pages are allocated it
    is one kernel copy, where writing through a fresh shared mapping costs a
    page fault per 4 KiB (measured here: 0.4 ms against 1.4 ms for 4.8 MB).
    """
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


class ShmWriter:
    """Publisher side: one new file per shard slice and version, handed over to the shard.

    A file belongs to the shard once the shard answered the publish that
    names it (it renames or removes it); ``discard`` removes one the shard
    never answered for. A spare file per shard, allocated after each publish,
    makes the next write one copy without page allocation.
    """

    def __init__(self, directory: str = SHM_DIR) -> None:
        self.base = f"{directory}/{PREFIX}{os.getpid()}-{secrets.token_hex(16)}-pub"
        self.spares: dict[int, tuple[str, int]] = {}  # shard -> (path, size)
        self.sizes: dict[int, int] = {}  # shard -> size of its last slice
        self._count = itertools.count(1)  # next() is atomic: slices are written by several threads

    def _name(self) -> str:
        return f"{self.base}{next(self._count)}"

    def write(self, shard: int, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Write ``arrays`` to a new file; returns the ``publish.shm`` field naming it."""
        descriptors, size = layout_of(arrays)
        self.sizes[shard] = size
        spare = self.spares.pop(shard, None)
        if spare is not None and spare[1] == size:
            path = spare[0]
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        else:
            if spare is not None:
                discard(spare[0])
            path = self._name()
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, size)
        _fill(fd, path, descriptors, arrays)
        return {"path": path, "arrays": descriptors}

    def prepare(self, shard: int) -> None:
        """Allocate ``shard``'s next file now (after a publish, off the readers' path)."""
        size = self.sizes.get(shard)
        if size is None or shard in self.spares:
            return
        path = self._name()
        _allocate(path, size)
        self.spares[shard] = (path, size)

    def take_back(self, shard: int, paths: Any) -> None:
        """Reuse files a shard handed back (``publish_ack.free``) as ``shard``'s next file.

        Each must be a regular file of ours in /dev/shm under a shard's name (no
        symlink, no published version); others are left alone. One of the slice's
        size becomes the shard's spare under one of this writer's names; the rest
        (a spare already kept, another size) are removed: handed to us, ours to remove.
        """
        if not isinstance(paths, list):
            return
        size = self.sizes.get(shard)
        for path in paths:
            if not isinstance(path, str) or not _NAME.match(path) or ".." in path or _PUBLISHED.match(path):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()):
                continue
            if shard in self.spares or st.st_size != size:
                discard(path)  # handed to us: ours to remove
                continue
            mine = self._name()
            try:
                os.rename(path, mine)
            except OSError:
                continue
            self.spares[shard] = (mine, st.st_size)

    def close(self) -> None:
        for path, _ in self.spares.values():
            discard(path)
        self.spares.clear()


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
    if not isinstance(path, str) or not _PUBLISHED.match(path):
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
