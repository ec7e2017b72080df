"""The raw pyzmq references of bench.wire.weight_sync: no protocol, zero-copy frames, bytes checked after the clock.

- :func:`run_raw_one`: a DEALER sends the tensors to one reader (the ceiling ``raw``).
- :class:`RawPubSub`: a PUB sends them to 4 SUB reader processes (``raw_pubsub_tcp``/``_ipc``).
  With ``relay``, the topology of the paramserver path with shared memory off: the publisher PUSHes
  the tensors to a relay process, which PUBlishes what it receives, zero-copy, to the 4 readers.
  ``relay="whole"`` forwards a version once all of it has arrived, as a shard does
  (``raw_relay_tcp``); ``relay="chunked"`` sends the version as messages of at most
  :data:`CHUNK_BYTES` (slices of one tensor each) that the relay forwards as each arrives, so the
  hop and the fan-out overlap (``raw_relay_chunked_tcp``): the floor of a pipelined shard on this
  machine. Its readers keep the chunks as received; putting them back into whole tensors (a copy,
  or ``recv_into`` a tensor's slice) is not counted.

Every reader reports (name, version, CLOCK_MONOTONIC ns) to :class:`Reports` once it holds a whole
version. It then compares the CRC-32 of each frame (tensor, or chunk) it holds with the CRC-32 of what
was published, handed to it at start, and the report names any that differ: :meth:`Reports.collect`
raises :class:`CorruptRead`, so a publish counts only once every reader holds the bytes that were
published. The check comes after the time is taken (it is not counted, as putting chunks back is not).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
import zlib
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np
import zmq

from rlfleet.common.wire.transport import free_tcp_port

READERS = 4
CHUNK_BYTES = 1 << 20


class CorruptRead(RuntimeError):
    """A reader holds a version whose bytes differ from what was published."""


def checksums(frames: Sequence[Any]) -> list[int]:
    """The CRC-32 of each frame's bytes (a numpy array, or any buffer)."""
    return [zlib.crc32(memoryview(f).cast("B")) for f in frames]


def mismatch(held: Sequence[Any], published: Sequence[int], what: str) -> str | None:
    """Which frames of ``held`` differ from the CRC-32s ``published`` (None: all equal)."""
    if len(held) != len(published):
        return f"{len(held)} {what}s held, {len(published)} published"
    bad = [f"{what} {i}: crc32 {got:08x}, published {want:08x}"
           for i, (got, want) in enumerate(zip(checksums(held), published, strict=True)) if got != want]
    return "; ".join(bad) or None


class Reports:
    """A PULL socket the reader processes report to."""

    def __init__(self) -> None:
        self.sock: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{free_tcp_port()}"
        self.sock.bind(self.address)

    def collect(self, version: int, count: int, timeout_s: float = 60.0) -> list[int]:
        """Times at which ``count`` readers reported holding ``version``. A report [name, version, ns] (ours'
        readers), or [name, version, ns, mismatch] (the raw readers'): CorruptRead if ``mismatch`` says what
        a reader holds differs from what was published."""
        times: dict[str, int] = {}
        deadline = time.monotonic() + timeout_s
        while len(times) < count:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                raise TimeoutError(f"only {len(times)} of {count} readers reported version {version}")
            name, v, t, *check = msgpack.unpackb(self.sock.recv())
            if check and check[0] is not None:
                raise CorruptRead(f"reader {name} holds version {v} with other bytes than published: {check[0]}")
            if v == version:
                times[name] = t
        return list(times.values())

    def close(self) -> None:
        self.sock.close()


def raw_reader_proc(address: str, name: str, report: str, published: list[int], dealer: bool = False,
                    chunked: bool = False) -> None:
    """A raw reader: SUB to the PUB/SUB references, or (``dealer``) DEALER to the one-reader send.

    A message is [version, *tensors], or with ``chunked`` [version, index, count, chunk]: the version
    is whole once all ``count`` chunks of it are held. ``published``: the CRC-32 of each tensor (each
    chunk) that was published, which what it holds is compared with once the time is taken."""
    ctx: zmq.Context[Any] = zmq.Context.instance()
    out = ctx.socket(zmq.PUSH)
    out.connect(report)
    sock = ctx.socket(zmq.DEALER if dealer else zmq.SUB)
    if not dealer:
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(address)
    if dealer:
        sock.send(b"ready")
    chunks: dict[int, dict[int, Any]] = {}  # version -> index -> chunk
    while True:
        frames = sock.recv_multipart(copy=False)
        version = int.from_bytes(frames[0].bytes, "little")
        if chunked:
            index, count = int.from_bytes(frames[1].bytes, "little"), int.from_bytes(frames[2].bytes, "little")
            held = chunks.setdefault(version, {})
            held[index] = np.frombuffer(frames[3].buffer, np.uint8)
            if len(held) < count:
                continue
            t = time.monotonic_ns()
            whole = [held[i] if i in held else b"" for i in range(count)]
            for old in [v for v in chunks if v <= version]:
                del chunks[old]
            what = "chunk"
        else:
            whole = [np.frombuffer(f.buffer, np.uint8) for f in frames[1:]]  # hold the bytes, as ours does
            t = time.monotonic_ns()
            what = "tensor"
        out.send(msgpack.packb([name, version, t, mismatch(whole, published, what)]))


def relay_proc(inbound: str, outbound: str) -> None:
    """PULL messages from the publisher and PUB each one, zero-copy, as soon as it has arrived."""
    ctx: zmq.Context[Any] = zmq.Context.instance()
    pull, pub = ctx.socket(zmq.PULL), ctx.socket(zmq.PUB)
    pull.bind(inbound)
    pub.bind(outbound)
    while True:
        pub.send_multipart(pull.recv_multipart(copy=False), copy=False)


def tensor_chunks(tensors: dict[str, np.ndarray], chunk_bytes: int = CHUNK_BYTES) -> list[np.ndarray]:
    """Each tensor's bytes in slices of at most ``chunk_bytes`` (no slice spans two tensors), zero-copy."""
    out: list[np.ndarray] = []
    for array in tensors.values():
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        out += [raw[i:i + chunk_bytes] for i in range(0, len(raw), chunk_bytes)]
    return out


class RawPubSub:
    """A raw PUB sending the tensors (zero-copy, one frame each) to 4 SUB reader processes; with
    ``relay`` ("whole" or "chunked"), through a relay process (module docstring)."""

    def __init__(self, tensors: dict[str, np.ndarray], transport: str = "tcp", relay: str | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.reports = Reports()
        self.relay = relay
        self.sock: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.PUSH if relay else zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.procs: list[Any] = []
        self.address = (f"ipc:///tmp/rlfleet-bench-ws-{os.getpid()}-{free_tcp_port()}" if transport == "ipc"
                        else f"tcp://127.0.0.1:{free_tcp_port()}")  # where the readers connect
        if relay:
            inbound = f"tcp://127.0.0.1:{free_tcp_port()}"
            self.procs.append(ctx.Process(target=relay_proc, args=(inbound, self.address), daemon=True))
            self.sock.connect(inbound)
        else:
            self.sock.bind(self.address)
        chunked = relay == "chunked"
        self.frames: list[Any] = [np.ascontiguousarray(a) for a in tensors.values()]  # buffers to pyzmq
        self.chunks: list[Any] = tensor_chunks(tensors) if chunked else []  # arrays are buffers to pyzmq
        published = checksums(self.chunks if chunked else self.frames)
        self.procs += [ctx.Process(target=raw_reader_proc, args=(self.address, f"raw{i}", self.reports.address,
                                                                 published, False, chunked), daemon=True)
                       for i in range(READERS)]
        for p in self.procs:
            p.start()
        self.version = 0
        try:
            # A SUB gets only what is sent after its subscription arrived: send version 0 until all hold it.
            deadline = time.monotonic() + 60
            while True:
                self._send(0)
                try:
                    self.reports.collect(0, READERS, timeout_s=0.2)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise
        except BaseException:
            self.close()
            raise

    def _send(self, version: int) -> None:
        v = version.to_bytes(8, "little")
        if not self.chunks:
            self.sock.send_multipart([v, *self.frames], copy=False)
            return
        count = len(self.chunks).to_bytes(4, "little")
        for i, chunk in enumerate(self.chunks):
            self.sock.send_multipart([v, i.to_bytes(4, "little"), count, chunk], copy=False)

    def publish(self) -> float:
        """ms from just before the send until the last of the 4 readers holds the next version."""
        self.version += 1
        time.sleep(0.02)
        t0 = time.monotonic_ns()
        self._send(self.version)
        return (max(self.reports.collect(self.version, READERS)) - t0) / 1e6

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.join(5)
        self.sock.close()
        self.reports.close()
        if self.address.startswith("ipc://"):
            with contextlib.suppress(OSError):
                os.unlink(self.address[len("ipc://"):])


def run_raw_one(tensors: dict[str, np.ndarray], reps: int) -> list[float]:
    """A raw DEALER send of the same tensors to a single reader (one copy, not four)."""
    ctx = mp.get_context("spawn")
    reports = Reports()
    sock: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    address = f"tcp://127.0.0.1:{free_tcp_port()}"
    sock.bind(address)
    frames: list[Any] = [np.ascontiguousarray(a) for a in tensors.values()]  # numpy arrays are buffers to pyzmq
    proc = ctx.Process(target=raw_reader_proc, args=(address, "raw", reports.address, checksums(frames), True),
                       daemon=True)
    proc.start()
    lat: list[float] = []
    try:
        if not sock.poll(60_000):
            raise TimeoutError("raw reader did not start")
        identity, _ = sock.recv_multipart()
        for version in range(0, reps + 1):
            time.sleep(0.02)
            t0 = time.monotonic_ns()
            sock.send_multipart([identity, version.to_bytes(8, "little"), *frames], copy=False)
            done = reports.collect(version, 1)[0]
            if version > 0:  # version 0 warms up, as for ours
                lat.append((done - t0) / 1e6)
    finally:
        proc.kill()
        proc.join(5)
        sock.close()
        reports.close()
    return lat
