"""The only decoder of the wire protocol (docs/protocol.md): it trusts nothing.

Every rejection is a :class:`~rlfleet.common.wire.codec.ProtocolError` with a
machine-readable ``reason``, checked before anything is built: the frame count
and sizes against :class:`~rlfleet.common.wire.codec.Limits`, the header's msgpack, its
envelope, the body against :data:`~rlfleet.common.wire.schema.MESSAGES`, each array's
descriptor against its frame. A sender repeats the same array layout in every
message, so a layout that passed once is remembered and compared whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np
import zmq

from rlfleet.common.wire.codec import (
    DEFAULT_LIMITS,
    DTYPE_NAMES,
    DTYPES,
    PACK_ALIGN,
    PROTOCOL_VERSION,
    Limits,
    Message,
    ProtocolError,
)
from rlfleet.common.wire.schema import MESSAGES, FieldSpec, MessageSpec, range_text


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


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not allowed")


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
            ext_hook=_no_ext,  # max_ext_len=0 still lets a zero-length ext through
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
    if "v" not in header:
        raise ProtocolError("missing_field", "header.v (protocol version, int) is missing")
    if type(version) is not int:  # msgpack gives exact types: bool is refused here too
        raise ProtocolError("version_mismatch", f"header.v is {version!r}, not an int; this side speaks"
                            f" protocol version {PROTOCOL_VERSION}")
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
    try:
        return _decode(buffers, limits)
    except ProtocolError as exc:
        exc.seq = _readable_seq(buffers[0], limits)  # so a client with several requests out knows which
        raise


def _readable_seq(header_frame: memoryview, limits: Limits) -> int:
    """The header's seq if it is readable and in range, else -1."""
    try:
        seq = _unpack_header(header_frame, limits).get("seq")
    except ProtocolError:
        return -1
    return seq if type(seq) is int and 0 <= seq < 1 << 64 else -1


def _decode(buffers: list[memoryview], limits: Limits) -> Message:
    total = sum(map(len, buffers))
    if total > limits.max_message_bytes:
        raise ProtocolError("message_too_large", f"{total} bytes; at most {limits.max_message_bytes}")
    header = _unpack_header(buffers[0], limits)
    version, mtype, sender, seq, descriptors, body = _envelope(header)
    spec = MESSAGES.get(mtype)
    if spec is None:
        raise ProtocolError("unknown_type", f"message type {mtype!r} is not defined; known: {sorted(MESSAGES)}")
    if spec.needs_sender and not sender:
        raise ProtocolError("bad_field", f"header.sender of {mtype} is empty; allowed: 1 to 256 characters, the"
                            " sender's own id ((sender, seq) is what makes it exactly-once)")
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
        if known is not None and known[0] is limits and known[1] == descriptors and _int_dims(descriptors):
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


def _int_dims(descriptors: list[Any]) -> bool:
    """Whether every shape dim is an int: ``==`` against a cached layout takes 4.0 and True for 4 and 1."""
    return all(type(d) is int for item in descriptors for d in item[2])


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
    if known is not None and known[0] is limits and known[1] == descriptors and _int_dims(descriptors):
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
        if fspec.bounds is not None and type(value) is int and not fspec.bounds[0] <= value <= fspec.bounds[1]:
            raise ProtocolError("bad_field", f"{spec.name}.{name} = {value}; allowed: an int from"
                                f" {range_text(fspec.bounds)}")
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
        if aspec.dtypes and DTYPE_NAMES[arr.dtype] not in aspec.dtypes:
            raise ProtocolError(
                "bad_dtype", f"{spec.name}.{name} must have dtype in {list(aspec.dtypes)}, got {arr.dtype}"
            )
        if aspec.ndim is not None and arr.ndim != aspec.ndim:
            raise ProtocolError("bad_shape", f"{spec.name}.{name} must have {aspec.ndim} dims, got {arr.ndim}")
    if not spec.open_arrays:
        extra = sorted(set(arrays) - set(spec.arrays))
        if extra:
            raise ProtocolError("unexpected_array", f"{spec.name} takes no array named {extra[0]!r}")
