"""The rlfleet wire protocol: one msgpack header frame plus raw array frames.

docs/protocol.md is the authority; this module is the only encoder and
decoder. A message on the wire is one ZeroMQ multipart message:

    [ROUTER identity frames] header payload_0 payload_1 ...

The header is a msgpack map ``{v, type, sender, seq, arrays, body}`` where
``arrays`` lists ``[name, dtype, shape]`` for each payload frame, in order.
Every payload frame holds the raw bytes of one C-contiguous little-endian
array. Nothing is pickled, ever.

The decoder trusts nothing: every rejection is a :class:`ProtocolError` with a
machine-readable ``reason`` (one of :data:`REASONS`), and no other exception
escapes :func:`decode`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

from common.messages import MESSAGES, FieldSpec, MessageSpec

PROTOCOL_VERSION = 1

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
_DTYPE_NAMES = {np.dtype(name): name for name in DTYPES}

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
    name = _DTYPE_NAMES.get(dtype)  # fast path: native little-endian dtypes
    if name is None:
        name = _DTYPE_NAMES.get(np.dtype(dtype).newbyteorder("<"))
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


# -- inserts as InsertClient sends them ----------------------------------------------
# A sender repeats everything of its inserts but seq and window_start, so InsertEncoder keeps
# the header's bytes up to window_start's value (the "prefix") for a layout and packs the two
# ints after it; a receiver that fully decoded one insert of a prefix may take the next ones
# of that prefix by reading the two ints alone (read_insert_tail).

_SEQ_KEY = b"\xa3seq"
_CF_SEQ_KEY = _SEQ_KEY + b"\xcf"  # the key, then a uint64's marker
_TWO_U64 = struct.Struct(">Q5xQ")  # uint64, the 5 bytes above, uint64 (msgpack is big-endian)


def _packb(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def insert_header_prefix(table: str, sender: str, descriptors: list[Any]) -> bytes:
    """The header bytes of a packed insert with ``merge_acks`` up to its ``window_start`` value:
    a map of 7 whose last key is ``seq``, its body a map of 3 whose last key is ``window_start``."""
    return b"".join((
        b"\x87",
        *map(_packb, ("v", PROTOCOL_VERSION, "type", "insert", "sender", sender, "arrays", descriptors,
                      "packed", True, "body")),
        b"\x83",
        *map(_packb, ("table", table, "merge_acks", True, "window_start")),
    ))


def read_insert_tail(header: bytes, start: int) -> tuple[int, int] | None:
    """(window_start, seq) if ``header[start:]`` is exactly what :func:`insert_header_prefix`'s
    header ends with (an int, the key ``seq``, an int in [0, 2**64)); None for anything else."""
    if len(header) - start == 22 and header[start] == 0xCF and header[start + 9:start + 14] == _CF_SEQ_KEY:
        # the usual form (InsertClient's seqs are microseconds since 1970): two uint64s, no decoder
        ws, seq = _TWO_U64.unpack_from(header, start + 1)
        return ws, seq
    if len(header) - start > 32:  # two ints of at most 9 bytes and the key
        return None
    try:
        tail = msgpack.unpackb(b"\x93" + header[start:], raw=False, max_ext_len=0)  # the 3 as one array
    except Exception:  # anything but the usual form: the caller decodes the whole message
        return None
    if type(tail) is not list:
        return None
    ws, key, seq = tail
    if type(ws) is not int or key != "seq" or type(seq) is not int or not 0 <= seq < 1 << 64:
        return None
    return ws, seq


class InsertEncoder:
    """Encodes inserts as InsertClient sends them: a header and one packed payload frame.

    The header's bytes are kept for the last layout (table, sender, column names, dtypes and
    shapes; :func:`insert_header_prefix`) and only ``window_start`` and ``seq`` are packed per
    insert; the payload is :func:`pack_arrays`. Anything the kept layout does not cover (other
    columns, non-contiguous or non-wire dtypes) takes :func:`encode`. Both give a message this
    module's :func:`decode` reads (header keys in another order).
    """

    def __init__(self) -> None:
        self._key: list[Any] | None = None
        self._prefix = b""
        self._pack = msgpack.Packer(use_bin_type=True).pack  # packb builds a Packer per call

    def frames(self, table: str, arrays: Mapping[str, np.ndarray], sender: str, seq: int,
               window_start: int) -> list[Any]:
        values = list(arrays.values())
        key = [table, sender, *arrays, *[a.dtype for a in values], *[a.shape for a in values]]
        if key != self._key and not self._learn(key, table, arrays, sender):
            return self._general(table, arrays, sender, seq, window_start)
        for arr in values:
            if not arr.flags.c_contiguous:
                return self._general(table, arrays, sender, seq, window_start)
        pack = self._pack
        return [b"".join((self._prefix, pack(window_start), _SEQ_KEY, pack(seq))), pack_arrays(values)]

    @staticmethod
    def _general(table: str, arrays: Mapping[str, np.ndarray], sender: str, seq: int,
                 window_start: int) -> list[Any]:
        body = {"table": table, "window_start": window_start, "merge_acks": True}
        return encode(Message("insert", body, dict(arrays), sender, seq), packed=True)

    def _learn(self, key: list[Any], table: str, arrays: Mapping[str, np.ndarray], sender: str) -> bool:
        """Keep the header bytes of this layout; False if it needs the general encoder."""
        descriptors = []
        for name, arr in arrays.items():
            dname = _DTYPE_NAMES.get(arr.dtype)  # native little-endian dtypes only
            if dname is None or arr.dtype != DTYPES[dname]:  # e.g. big-endian: encode() converts it
                self._key = None
                return False
            descriptors.append([name, dname, list(arr.shape)])
        self._prefix = insert_header_prefix(table, sender, descriptors)
        self._key = key
        return True


def _buffer(frame: Any) -> Any:
    """A bytes-like view of one frame whose ``len()`` is its size in bytes.

    bytes and zmq.Frame (received with copy=False) are used as they are:
    both give their size in bytes to len() and their memory to msgpack and
    np.frombuffer without a copy. Anything else becomes a flat memoryview.
    """
    kind = type(frame)
    if kind is bytes or kind is zmq.Frame:
        return frame
    buf = getattr(frame, "buffer", None)  # a zmq.Frame subclass
    if buf is None:
        buf = memoryview(frame)
    return buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf


def _unpack_header(raw: Any, limits: Limits) -> dict[str, Any]:
    if len(raw) > limits.max_header_bytes:
        raise ProtocolError(
            "header_too_large", f"header is {len(raw)} bytes; at most {limits.max_header_bytes}"
        )
    n = limits.max_header_items
    try:
        header = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=limits.max_header_bytes,
            max_bin_len=limits.max_header_bytes,
            max_array_len=n,
            max_map_len=n,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types on hostile input
        raise ProtocolError("bad_msgpack", f"header is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise ProtocolError("bad_header", f"header must be a map, got {type(header).__name__}")
    return header


def _check_field(where: str, name: str, value: Any, spec: FieldSpec, depth: int = 0) -> None:
    if not spec.accepts(value):
        raise ProtocolError(
            "bad_field", f"{where}.{name} must be {spec.describe()}, got {type(value).__name__}"
        )
    _check_depth(where, name, value, depth)


def _check_depth(where: str, name: str, value: Any, depth: int) -> None:
    if depth > 4:
        raise ProtocolError("bad_field", f"{where}.{name} is nested deeper than 4 levels")
    if isinstance(value, dict):
        for v in value.values():
            _check_depth(where, name, v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_depth(where, name, v, depth + 1)


def _envelope(header: dict[str, Any]) -> tuple[int, str, str, int, list[Any], dict[str, Any]]:
    version = header.get("v")
    if type(version) is not int:  # msgpack gives exact types: bool is refused here too
        raise ProtocolError("missing_field", "header.v (protocol version, int) is missing")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            "version_mismatch",
            f"message speaks protocol version {version}; this side speaks {PROTOCOL_VERSION}",
        )
    mtype: Any = header.get("type")
    sender: Any = header.get("sender")
    seq: Any = header.get("seq")
    arrays: Any = header.get("arrays")
    body: Any = header.get("body")
    # one test for the well-formed case; anything else is named by the field-by-field checks below
    if not (type(mtype) is str and type(sender) is str and type(seq) is int and type(arrays) is list
            and type(body) is dict):
        for key, kind in (("type", str), ("sender", str), ("seq", int), ("arrays", list), ("body", dict)):
            if key not in header:
                raise ProtocolError("missing_field", f"header.{key} is missing")
            value = header[key]
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ProtocolError(
                    "bad_field", f"header.{key} must be {kind.__name__}, got {type(value).__name__}"
                )
    if not 0 <= seq < 1 << 64:
        raise ProtocolError("bad_field", "header.seq must be in [0, 2**64)")
    if len(sender) > 256:
        raise ProtocolError("bad_field", "header.sender is longer than 256 characters")
    return version, mtype, sender, seq, arrays, body


def _descriptor(item: Any, limits: Limits) -> tuple[str, np.dtype[Any], list[int], int]:
    if type(item) is not list or len(item) != 3:
        raise ProtocolError("bad_array_descriptor", "each header.arrays item must be [name, dtype, shape]")
    name, dtype_name, shape = item
    if type(name) is not str or not 0 < len(name) <= limits.max_name_chars:
        raise ProtocolError("bad_array_descriptor", "array name must be a non-empty string")
    dtype = DTYPES.get(dtype_name) if type(dtype_name) is str else None
    if dtype is None:
        raise ProtocolError(
            "bad_dtype", f"array {name!r}: dtype {dtype_name!r} is not allowed; allowed: {sorted(DTYPES)}"
        )
    if type(shape) is not list or len(shape) > limits.max_ndim:
        raise ProtocolError("bad_shape", f"array {name!r}: shape must be a list of at most {limits.max_ndim} ints")
    count = 1
    for d in shape:
        if type(d) is not int or not 0 <= d < 1 << 62:
            raise ProtocolError("bad_shape", f"array {name!r}: shape {shape!r} must hold non-negative ints")
        count *= d  # Python ints: no overflow
    if count > limits.max_array_elements:
        raise ProtocolError(
            "too_many_elements",
            f"array {name!r}: {count} elements; at most {limits.max_array_elements}",
        )
    return name, dtype, shape, count * dtype.itemsize


def decode(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode the frames of one message (identity frames already removed).

    Raises ProtocolError, and nothing else, for any input it rejects.
    Arrays are read-only views on the received frames.
    """
    if not frames:
        raise ProtocolError("empty_message", "a message needs at least a header frame")
    if len(frames) > limits.max_frames:
        raise ProtocolError("too_many_frames", f"{len(frames)} frames; at most {limits.max_frames}")
    try:
        buffers = [_buffer(f) for f in frames]
    except TypeError:
        raise ProtocolError("bad_header", "frames must be bytes-like") from None
    total = sum(map(len, buffers))
    if total > limits.max_message_bytes:
        raise ProtocolError("message_too_large", f"{total} bytes; at most {limits.max_message_bytes}")
    header = _unpack_header(buffers[0], limits)
    version, mtype, sender, seq, descriptors, body = _envelope(header)
    spec = MESSAGES.get(mtype)
    if spec is None:
        raise ProtocolError("unknown_type", f"message type {mtype!r} is not defined; known: {sorted(MESSAGES)}")
    _check_body(spec, body)
    packed = header.get("packed")
    if packed is not None and type(packed) is not bool:
        raise ProtocolError("bad_field", f"header.packed must be bool, got {type(packed).__name__}")
    if packed:
        if len(buffers) != 2:
            raise ProtocolError(
                "frame_count_mismatch", f"a packed message has exactly one payload frame; {len(buffers) - 1} came"
            )
        packed_arrays, packed_layout = _unpack_arrays(descriptors, buffers[1], limits)
        _check_arrays(spec, packed_arrays)
        return Message(type=mtype, body=body, arrays=packed_arrays, sender=sender, seq=seq, version=version,
                       layout=packed_layout)
    if len(descriptors) != len(buffers) - 1:
        raise ProtocolError(
            "frame_count_mismatch",
            f"header describes {len(descriptors)} arrays but {len(buffers) - 1} payload frames came",
        )
    arrays: dict[str, np.ndarray] = {}
    if descriptors:
        known = _layouts.get(len(descriptors))
        if known is not None and known[0] is limits and known[1] == descriptors:
            layout = known[2]  # the same [name, dtype, shape] items as a message that passed: valid
        else:
            layout = _layout(descriptors, buffers, limits)
            _layouts[len(descriptors)] = (limits, descriptors, layout)
        for (name, dtype, shape, nbytes), buf in zip(layout, buffers[1:], strict=True):
            if len(buf) != nbytes:
                _frame_length_mismatch(name, dtype, shape, nbytes, buf)
            arr = np.frombuffer(buf, dtype)  # the length is checked: no error, no copy
            if len(shape) != 1:
                arr = arr.reshape(shape)
            arr.setflags(write=False)  # a view of the received frame: copy before changing it
            arrays[name] = arr
    _check_arrays(spec, arrays)
    return Message(type=mtype, body=body, arrays=arrays, sender=sender, seq=seq, version=version)


Layout = tuple[tuple[str, np.dtype[Any], list[int], int], ...]

#: The last valid ``header.arrays`` seen for each array count, with its parsed layout. A sender
#: repeats the same names, dtypes and shapes in every message, and comparing two lists is much
#: cheaper than checking every item again. Entries are replaced whole (safe across threads).
_layouts: dict[int, tuple[Limits, list[Any], Layout]] = {}


def _layout(descriptors: list[Any], buffers: list[Any], limits: Limits) -> Layout:
    """Check every ``[name, dtype, shape]`` item, and each frame's length as soon as its item is."""
    layout = []
    names = set()
    for item, buf in zip(descriptors, buffers[1:], strict=True):
        name, dtype, shape, nbytes = _descriptor(item, limits)
        if name in names:
            raise ProtocolError("bad_array_descriptor", f"array {name!r} appears twice")
        if len(buf) != nbytes:
            _frame_length_mismatch(name, dtype, shape, nbytes, buf)
        names.add(name)
        layout.append((name, dtype, shape, nbytes))
    return tuple(layout)


PackedLayout = tuple[tuple[tuple[str, np.dtype[Any], tuple[int, ...], int], ...], int]

#: as ``_layouts``, for packed messages: items (name, dtype, shape, offset) and the payload size
_packed_layouts: dict[int, tuple[Limits, list[Any], PackedLayout]] = {}


def _unpack_arrays(descriptors: list[Any], buf: Any, limits: Limits) -> tuple[dict[str, np.ndarray], PackedLayout]:
    """The arrays of a packed payload frame (read-only views, built once its length is checked)
    and their layout object."""
    known = _packed_layouts.get(len(descriptors))
    if known is not None and known[0] is limits and known[1] == descriptors:
        layout = known[2]
    else:
        layout = _packed_layout(descriptors, limits)
        _packed_layouts[len(descriptors)] = (limits, descriptors, layout)
    items, total = layout
    if len(buf) != total:
        raise ProtocolError(
            "frame_length_mismatch",
            f"packed payload frame has {len(buf)} bytes; its {len(items)} arrays (each at a multiple of "
            f"{PACK_ALIGN} bytes) need {total}",
        )
    view = memoryview(buf).toreadonly()  # views of the received frame: copy before changing them
    arrays = {name: np.ndarray(shape, dtype, view, offset)  # inside the checked length: no error, no copy
              for name, dtype, shape, offset in items}
    return arrays, layout


def _packed_layout(descriptors: list[Any], limits: Limits) -> PackedLayout:
    items = []
    names = set()
    end = 0
    for item in descriptors:
        name, dtype, shape, nbytes = _descriptor(item, limits)
        if name in names:
            raise ProtocolError("bad_array_descriptor", f"array {name!r} appears twice")
        names.add(name)
        offset = end + (-end % PACK_ALIGN)
        items.append((name, dtype, tuple(shape), offset))
        end = offset + nbytes
    return tuple(items), end


def _frame_length_mismatch(name: str, dtype: np.dtype[Any], shape: list[int], nbytes: int, buf: Any) -> None:
    raise ProtocolError(
        "frame_length_mismatch",
        f"array {name!r}: frame has {len(buf)} bytes, shape {list(shape)} x {dtype.itemsize} needs {nbytes}",
    )


#: body values of these exact types pass a field of that kind without further checks
_PLAIN: dict[str, tuple[type, ...]] = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,)}


def _check_body(spec: MessageSpec, body: Mapping[str, Any]) -> None:
    for name, fspec in spec.fields.items():
        if name not in body:
            if fspec.required:
                raise ProtocolError("missing_field", f"{spec.name}.{name} is required")
            continue
        value = body[name]
        if type(value) not in _PLAIN.get(fspec.kind, ()):  # a scalar of the right type needs no more
            _check_field(spec.name, name, value, fspec)
    # Unknown fields are ignored (forward compatibility), but must stay shallow.
    for name, value in body.items():
        if name not in spec.fields:
            _check_depth(spec.name, str(name), value, 0)


def _check_arrays(spec: MessageSpec, arrays: Mapping[str, np.ndarray]) -> None:
    for name, aspec in spec.arrays.items():
        if name not in arrays:
            if aspec.required:
                raise ProtocolError("missing_array", f"{spec.name} needs array {name!r}")
            continue
        arr = arrays[name]
        if aspec.dtypes and _DTYPE_NAMES[arr.dtype] not in aspec.dtypes:
            raise ProtocolError(
                "bad_dtype", f"{spec.name}.{name} must have dtype in {list(aspec.dtypes)}, got {arr.dtype}"
            )
        if aspec.ndim is not None and arr.ndim != aspec.ndim:
            raise ProtocolError("bad_shape", f"{spec.name}.{name} must have {aspec.ndim} dims, got {arr.ndim}")
    if not spec.open_arrays:
        extra = sorted(set(arrays) - set(spec.arrays))
        if extra:
            raise ProtocolError("unexpected_array", f"{spec.name} takes no array named {extra[0]!r}")
