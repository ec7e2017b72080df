"""Durability of a replay shard: atomic snapshots and a write-ahead log. No pickle.

- Snapshot: one ``snapshot.npz`` (a zip of ``.npy`` files written with
  ``allow_pickle=False``) holding every live item of every table plus a
  msgpack index (table metadata, rate limiter counters, dedup state, and the
  last log file of the WAL it covers). Written to a temp file, fsync'ed, renamed over
  the old one, then the directory is fsync'ed: a crash leaves the old or the
  new snapshot, never half of one. The caller copies the arrays (under its
  lock, i.e. in its loop thread); :class:`Snapshotter` writes them in a
  thread.
- WAL: log files ``wal-00000001.log``... of records
  ``magic | header_len | payload_len | crc32 | msgpack header | raw arrays``.
  The server appends every stored insert (and every queue pop), and calls
  :meth:`WriteAheadLog.sync` (flush + fsync) once per burst of messages,
  before it sends the acks of that burst. A snapshot rotates the log; the
  files it covers are deleted once it is on disk. Replay stops at the
  first torn or corrupt record of a file (only a tail can be torn, and a
  torn record was never acked). A record is written with one ``writev``; if
  that fails (disk full, file too large), whatever part of it reached the
  file is cut off again, so the records appended after it stay readable, and
  :class:`WalError` says the insert was not logged. If the cut itself fails,
  the log refuses every further append (a record after a torn one would be
  lost to replay). If an fsync fails, the log refuses every further append
  and sync (see :meth:`WriteAheadLog.sync`): the replay service stops
  without acking what that fsync covered, and a restart recovers from the log.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

log = logging.getLogger(__name__)

SNAPSHOT = "snapshot.npz"
_INDEX = "__index__"
_REC = struct.Struct("<4sIII")
_MAGIC = b"RLW1"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_snapshot(path: Path, index: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> int:
    """Atomically replace ``path`` with (index, arrays); returns bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    names = {name: f"a{i}" for i, name in enumerate(arrays)}
    packed = msgpack.packb({**index, "arrays": names}, use_bin_type=True)
    with open(tmp, "wb") as f:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for member, arr in ((_INDEX, np.frombuffer(packed, np.uint8)),
                                *((names[n], a) for n, a in arrays.items())):
                with zf.open(member + ".npy", "w", force_zip64=True) as out:
                    np.lib.format.write_array(out, np.ascontiguousarray(arr), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
        size = f.tell()
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return size


def read_snapshot(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as z:
        index = msgpack.unpackb(z[_INDEX].tobytes(), raw=False, strict_map_key=False)
        arrays = {name: z[member] for name, member in index.pop("arrays").items()}
    return index, arrays


class Snapshotter:
    """Writes one snapshot at a time in a background thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread: threading.Thread | None = None
        self.last_seconds = 0.0
        self.last_bytes = 0
        self.count = 0
        self.error: BaseException | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, index: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
              then: Callable[[], None] | None = None) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._write, args=(index, arrays, then),
                                        name="replay-snapshot", daemon=True)
        self._thread.start()

    def _write(self, index: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
               then: Callable[[], None] | None) -> None:
        t0 = time.monotonic()
        try:
            self.last_bytes = write_snapshot(self.path, index, arrays)
            self.last_seconds = time.monotonic() - t0
            self.count += 1
            if then is not None:
                then()
        except Exception as exc:  # a full disk must not kill the server; it is logged and retried later
            self.error = exc
            log.exception("replay snapshot to %s failed", self.path)

    def wait(self, timeout_s: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True


class WalError(OSError):
    """A record could not be appended to the log (nothing of it is left in the file)."""


class WriteAheadLog:
    """Append-only log files of insert and pop records."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        existing = self.files()
        self.log_file = (existing[-1] if existing else 0) + 1  # the number of the file appended to
        self._open()
        self._dirty = False
        self.syncs = 0
        self.failed_appends = 0
        self._refused = 0  # appends refused since the last one that succeeded
        self._sync_failed: str | None = None  # why an fsync failed: the log is not trusted after it
        self._broken: str | None = None  # why appends are refused (a torn record could not be cut off)

    def _open(self) -> None:
        # unbuffered: a record is one writev, and what a failed one left is cut off by size
        self._fd = os.open(self._path(self.log_file), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size
        self._synced = self._size  # the file's size at its last good fsync

    def _path(self, log_file: int) -> Path:
        return self.dir / f"wal-{log_file:08d}.log"

    def files(self) -> list[int]:
        """The numbers of the log files in the directory, in order."""
        out = []
        for p in self.dir.glob("wal-*.log"):
            try:
                out.append(int(p.stem.split("-", 1)[1]))
            except ValueError:
                continue
        return sorted(out)

    def _append(self, header: Mapping[str, Any], payload: list[np.ndarray]) -> None:
        head = msgpack.packb(header, use_bin_type=True)
        bufs = [memoryview(np.ascontiguousarray(a)).cast("B") for a in payload]  # type: ignore[arg-type]
        crc = zlib.crc32(head)
        for b in bufs:
            crc = zlib.crc32(b, crc)
        if self._broken is not None:
            raise WalError(f"write-ahead log {self._path(self.log_file).name} refuses appends: {self._broken}")
        parts: list[Any] = [_REC.pack(_MAGIC, len(head), sum(len(b) for b in bufs), crc), head, *bufs]
        total = sum(len(b) for b in parts)
        done = 0
        try:
            done = os.writev(self._fd, parts)
            while done < total:  # a short write (e.g. at a file size limit): the rest, or the error why not
                rest = b"".join(bytes(b) for b in parts)[done:]
                done += os.write(self._fd, rest)
        except OSError as exc:
            self.failed_appends += 1
            self._refused += 1
            self._cut(exc)
            if self._refused == 1 or self._refused % 1000 == 0:  # an operator must free space: say so, not per record
                log.warning("replay wal: %s: %s; records are refused (nothing stored) until it has room (%d so far)",
                            self._path(self.log_file), exc.strerror or exc, self._refused)
            raise WalError(f"write-ahead log {self._path(self.log_file).name}: {exc.strerror or exc}") from exc
        if self._refused:
            log.warning("replay wal: %s takes records again, after refusing %d", self._path(self.log_file),
                        self._refused)
            self._refused = 0
        self._size += total
        self._dirty = True

    def _cut(self, exc: OSError) -> None:
        """Cut off what a failed append left in the file, so the next record follows the last good one."""
        try:
            os.ftruncate(self._fd, self._size)
        except OSError as cut:
            self._broken = f"a failed append ({exc}) could not be cut off ({cut})"
            log.error("replay wal: %s; no further inserts are stored", self._broken)

    def append_insert(self, table: str, first_key: int, arrays: Mapping[str, np.ndarray],
                      sender: str, seq: int, window_start: int | None) -> None:
        cols = [[name, a.dtype.str, list(a.shape)] for name, a in arrays.items()]
        self._append({"op": "insert", "table": table, "key": first_key, "sender": sender, "seq": seq,
                      "ws": window_start, "cols": cols}, list(arrays.values()))

    def append_pop(self, table: str, head: int) -> None:
        self._append({"op": "pop", "table": table, "head": head}, [])

    @property
    def sync_failed(self) -> bool:
        """An fsync failed: nothing appended since the last good one may be acked (see :meth:`sync`)."""
        return self._sync_failed is not None

    def sync(self) -> bool:
        """Flush and fsync what was appended since the last sync; True if anything was.

        An fsync that fails (EIO: the disk lost writes) raises :class:`WalError`, and so does every
        later call: Linux may report such a failure once and then mark the lost pages clean, so a
        second fsync can succeed without what the first one covered being on disk (PostgreSQL's
        "fsyncgate", 2018). Nothing synced after it can be trusted: the caller must not ack what
        it appended since the last good sync (cut off again, as far as the kernel lets us), and
        should restart from the log."""
        if self._sync_failed is not None:
            raise WalError(f"write-ahead log {self._path(self.log_file).name}: an fsync failed "
                           f"({self._sync_failed}); what it covered may not be on disk")
        if not self._dirty:
            return False
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self._sync_failed = exc.strerror or str(exc)
            self._broken = f"an fsync failed ({self._sync_failed})"
            # best effort: cut off what that fsync covered, so that a restart on this machine does
            # not read back, from the page cache, records that may not be on disk: inserts nobody
            # was told are stored (their resends are stored anew) and pops whose batches never left
            try:
                os.ftruncate(self._fd, self._synced)
            except OSError as cut:
                log.error("replay wal: %s: records after byte %d could not be cut off (%s)",
                          self._path(self.log_file), self._synced, cut)
            raise WalError(f"write-ahead log {self._path(self.log_file).name}: fsync failed: "
                           f"{self._sync_failed}") from exc
        self._synced = self._size
        self._dirty = False
        self.syncs += 1
        return True

    def rotate(self) -> int:
        """Close the current log file (synced) and start the next; returns the closed one."""
        self.sync()
        os.close(self._fd)
        closed = self.log_file
        self.log_file += 1
        self._open()
        self._broken = None  # a new file: the torn record stays behind in the closed one
        return closed

    def drop_through(self, log_file: int) -> None:
        for s in self.files():
            if s <= log_file and s != self.log_file:
                self._path(s).unlink(missing_ok=True)

    def close(self) -> None:
        try:
            if not self.sync_failed:  # after a failed fsync, a new one proves nothing
                self.sync()
        finally:
            os.close(self._fd)

    def replay(self, after: int, before: int) -> Iterator[tuple[dict[str, Any], dict[str, np.ndarray]]]:
        """Records of the log files numbered in (after, before), in order."""
        for s in self.files():
            if after < s < before:
                yield from read_log_file(self._path(s))


def read_log_file(path: Path) -> Iterator[tuple[dict[str, Any], dict[str, np.ndarray]]]:
    data = path.read_bytes()
    pos = 0
    while pos < len(data):
        if pos + _REC.size > len(data):
            log.warning("%s: torn record header at byte %d; the rest is ignored", path.name, pos)
            return
        magic, hlen, plen, crc = _REC.unpack_from(data, pos)
        end = pos + _REC.size + hlen + plen
        if magic != _MAGIC or end > len(data):
            log.warning("%s: torn or corrupt record at byte %d; the rest is ignored", path.name, pos)
            return
        body = memoryview(data)[pos + _REC.size:end]
        if zlib.crc32(body) != crc:
            log.warning("%s: checksum mismatch at byte %d; the rest is ignored", path.name, pos)
            return
        header = msgpack.unpackb(body[:hlen], raw=False)
        arrays: dict[str, np.ndarray] = {}
        off = hlen
        for name, dtype, shape in header.get("cols", []):
            dt = np.dtype(dtype)
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            arrays[name] = np.frombuffer(body[off:off + n], dt).reshape(shape)
            off += n
        yield header, arrays
        pos = end


