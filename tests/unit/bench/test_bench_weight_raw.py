"""bench.wire.weight_raw's relays, the floors bench.wire.weight_sync --frames measures ours against: chunks never
span two tensors and put back give the tensors; a reader reports a version only once all of it arrived, and
a version whose bytes differ from what was published (one byte of one chunk or tensor) fails the publish."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench.wire.weight_raw import CorruptRead, RawPubSub, run_raw_one, tensor_chunks


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"a": rng.standard_normal((300, 1000), dtype=np.float32), "b": rng.standard_normal(7, dtype=np.float32),
            "c": rng.standard_normal((1 << 18) + 5, dtype=np.float32)}


def test_chunks_are_slices_of_one_tensor_each_and_give_the_tensors_back() -> None:
    t = tensors()
    chunks = tensor_chunks(t, chunk_bytes=1 << 19)
    assert max(c.nbytes for c in chunks) <= 1 << 19
    assert len(chunks) == 3 + 1 + 3  # 1.2 MB in 3, 28 bytes in 1, ~1 MB + 20 bytes in 3
    back = np.concatenate(chunks)
    assert back.tobytes() == b"".join(a.tobytes() for a in t.values())
    assert all(np.shares_memory(c, a) for c, a in zip(chunks[:3], [t["a"]] * 3, strict=True))  # zero-copy


@pytest.mark.parametrize("relay", [None, "whole", "chunked"])
def test_every_reader_gets_each_version_whole(relay: str | None) -> None:
    side = RawPubSub(tensors(), "tcp", relay=relay)
    try:
        for _ in range(3):
            side.publish()  # raises TimeoutError unless all READERS report the version
    finally:
        side.close()


def test_a_chunked_reader_does_not_report_a_version_missing_a_chunk() -> None:
    side = RawPubSub(tensors(), "tcp", relay="chunked")
    try:
        v, count = (7).to_bytes(8, "little"), len(side.chunks).to_bytes(4, "little")
        for i, chunk in list(enumerate(side.chunks))[:-1]:  # all but the last chunk
            side.sock.send_multipart([v, i.to_bytes(4, "little"), count, chunk], copy=False)
        with pytest.raises(TimeoutError):
            side.reports.collect(7, 1, timeout_s=0.5)
    finally:
        side.close()


def flipped(frame: np.ndarray, at: int) -> np.ndarray:
    """A copy of ``frame``'s bytes with the byte at ``at`` changed."""
    out = np.frombuffer(frame.tobytes(), np.uint8).copy()
    out[at] ^= 0x40
    return out


def test_a_chunked_reader_catches_a_corrupted_chunk() -> None:
    side = RawPubSub(tensors(), "tcp", relay="chunked")
    try:
        v, count = (7).to_bytes(8, "little"), len(side.chunks).to_bytes(4, "little")
        for i, chunk in enumerate(side.chunks):  # every chunk arrives, the second with one byte changed
            data: Any = flipped(chunk, 1234) if i == 1 else chunk
            side.sock.send_multipart([v, i.to_bytes(4, "little"), count, data], copy=False)
        for _ in range(4):  # each reader's report
            with pytest.raises(CorruptRead, match=r"version 7 .*: chunk 1: crc32 [0-9a-f]{8}, published"):
                side.reports.collect(7, 4, timeout_s=30)
        side.publish()  # the bytes published again, whole: every reader holds them
    finally:
        side.close()


@pytest.mark.parametrize("relay", [None, "whole"])
def test_a_reader_of_whole_tensors_catches_a_corrupted_tensor(relay: str | None) -> None:
    side = RawPubSub(tensors(), "tcp", relay=relay)
    try:
        frames: list[Any] = [flipped(f, 0) if i == 1 else f for i, f in enumerate(side.frames)]
        side.sock.send_multipart([(7).to_bytes(8, "little"), *frames], copy=False)
        for _ in range(4):  # each reader's report
            with pytest.raises(CorruptRead, match=r"version 7 .*: tensor 1: crc32 [0-9a-f]{8}, published"):
                side.reports.collect(7, 4, timeout_s=30)
        side.publish()  # the bytes published again, whole: every reader holds them
    finally:
        side.close()


def test_the_one_reader_send_checks_what_it_read() -> None:
    assert len(run_raw_one(tensors(), reps=2)) == 2
