"""The rlfleet wire protocol: one msgpack header frame plus raw array frames.

docs/protocol.md is the authority; this module is the only encoder (with
:mod:`rlfleet.common.wire.inserts`, the inserts' fast path) and
:mod:`rlfleet.common.wire.decoder` the only decoder. A message on the wire is one ZeroMQ multipart message:

    [ROUTER identity frames] header payload_0 payload_1 ...

The header is a msgpack map ``{v, type, sender, seq, arrays, body}`` where
``arrays`` lists ``[name, dtype, shape]`` for each payload frame, in order.
Every payload frame holds the raw bytes of one C-contiguous little-endian
array. Nothing is pickled, ever.

The decoder trusts nothing: every rejection is a :class:`ProtocolError` with a
machine-readable ``reason`` (one of :data:`REASONS`), and no other exception
escapes :func:`~rlfleet.common.wire.decoder.decode`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from rlfleet.common.wire.schema import MESSAGES

PROTOCOL_VERSION = 2  # 2: sample.beta and batch.weight removed (importance weights are the learner's)

#: in a packed message, every array starts at a multiple of this many bytes of the payload frame
PACK_ALIGN = 8

#: dtype names allowed on the wire (always little-endian on the wire).
DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
        "bool", "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64",
    )
}
DTYPE_NAMES = {np.dtype(name): name for name in DTYPES}

#: every reason a ProtocolError can carry; also the ``reason`` label values of
#: ``rlfleet_protocol_errors_total``.
REASONS = (
    "empty_message",
    "too_many_frames",
    "message_too_large",
    "header_too_large",
    "bad_msgpack",
    "bad_header",
    "version_mismatch",
    "unknown_type",
    "missing_field",
    "bad_field",
    "bad_array_descriptor",
    "bad_dtype",
    "bad_shape",
    "too_many_elements",
    "frame_count_mismatch",
    "frame_length_mismatch",
    "missing_array",
    "unexpected_array",
)


class ProtocolError(Exception):
    """A message that cannot be accepted. ``reason`` is machine-readable."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.seq = -1  # the message's seq where its header was readable: the error's ref_seq


@dataclass(frozen=True)
class Limits:
    """Bounds the decoder enforces before it builds anything."""

    max_frames: int = 64
    max_header_bytes: int = 64 * 1024
    max_message_bytes: int = 512 * 1024 * 1024
    max_array_elements: int = 1 << 28
    max_ndim: int = 8
    max_name_chars: int = 128
    max_header_items: int = 256


DEFAULT_LIMITS = Limits()


@dataclass
class Message:
    """One decoded (or to-be-encoded) message."""

    type: str
    body: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    sender: str = ""
    seq: int = 0
    version: int = PROTOCOL_VERSION
    #: set by decode for packed messages: one object per layout (array names, dtypes and shapes)
    #: the decoder has checked, the same for every message of that layout while it is cached; a
    #: receiver may remember what it checked of a layout by it (``is``, never ``==``)
    layout: Any = field(default=None, repr=False, compare=False)

    def __getitem__(self, key: str) -> Any:
        return self.body[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.body.get(key, default)


def wire_dtype_name(dtype: np.dtype[Any]) -> str:
    """The wire name of ``dtype``; raises ProtocolError if it is not allowed."""
    name = DTYPE_NAMES.get(dtype)  # fast path: native little-endian dtypes
    if name is None:
        name = DTYPE_NAMES.get(np.dtype(dtype).newbyteorder("<"))
    if name is None:
        raise ProtocolError("bad_dtype", f"dtype {dtype} is not allowed; allowed: {sorted(DTYPES)}")
    return name


def encode(msg: Message, *, packed: bool = False) -> list[Any]:
    """Frames for ``msg``: the header bytes, then one flat uint8 view per array.

    Array frames share memory with the arrays, so pyzmq sends them without a
    copy when called with ``copy=False``. ``len(frame)`` is its size in bytes.
    Non-contiguous arrays are copied to C order, big-endian ones converted.

    With ``packed`` every array is copied into one payload frame (bytes), each
    at an offset that is a multiple of 8 (docs/protocol.md, "Packed
    messages"): two frames instead of one per array, which costs a sender and
    a receiver less than a frame per column of a small batch.
    """
    if msg.type not in MESSAGES:
        raise ProtocolError("unknown_type", f"message type {msg.type!r} is not defined")
    descriptors = []
    payloads = []
    for name, array in msg.arrays.items():
        arr = array if isinstance(array, np.ndarray) else np.asarray(array)
        dname = wire_dtype_name(arr.dtype)
        if arr.dtype is not DTYPES[dname] and arr.dtype != DTYPES[dname]:
            arr = arr.astype(DTYPES[dname])  # big-endian in, little-endian out
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")  # keeps 0-d arrays 0-d, unlike ascontiguousarray
        descriptors.append([name, dname, list(arr.shape)])
        payloads.append(arr if packed else arr.reshape(-1).view(np.uint8))
    if packed:
        return [encode_header(msg.type, msg.body, msg.sender, msg.seq, descriptors, msg.version, packed=True),
                pack_arrays(payloads)]
    return [encode_header(msg.type, msg.body, msg.sender, msg.seq, descriptors, msg.version), *payloads]


_PAD = bytes(PACK_ALIGN - 1)


def pack_arrays(arrays: Sequence[np.ndarray]) -> bytes:
    """The payload frame of a packed message: C-contiguous little-endian ``arrays`` back to back,
    each starting at a multiple of 8 bytes (zero bytes between), nothing after the last."""
    parts: list[Any] = []
    offset = 0
    for arr in arrays:
        pad = -offset % PACK_ALIGN
        if pad:
            parts.append(_PAD[:pad])
            offset += pad
        parts.append(arr)  # bytes.join takes any C-contiguous buffer: one copy in all
        offset += arr.nbytes
    return b"".join(parts)


def encode_header(
    mtype: str, body: dict[str, Any], sender: str, seq: int, descriptors: list[Any] | None = None,
    version: int = PROTOCOL_VERSION, *, packed: bool = False,
) -> bytes:
    """The header frame alone: all of a message without arrays (an ack), with no Message to build."""
    header = {
        "v": version,
        "type": mtype,
        "sender": sender,
        "seq": seq,
        "arrays": [] if descriptors is None else descriptors,
        "body": body,
    }
    if packed:
        header["packed"] = True
    return msgpack.packb(header, use_bin_type=True)
