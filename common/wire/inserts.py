"""The insert fast path: inserts as InsertClient sends them, and the receiver's shortcut.

A sender repeats everything of its inserts but seq and window_start, so
:class:`InsertEncoder` keeps the header's bytes up to window_start's value (the
"prefix", :func:`insert_header_prefix`) for a layout and packs the two ints
after it; a receiver that fully decoded one insert of a prefix may take the
next ones of that prefix by reading the two ints alone (:func:`read_insert_tail`).
Everything here gives messages that :func:`rlfleet.common.wire.codec.decode` reads.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from rlfleet.common.wire.codec import DTYPE_NAMES, DTYPES, PROTOCOL_VERSION, Message, encode, pack_arrays

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
            dname = DTYPE_NAMES.get(arr.dtype)  # native little-endian dtypes only
            if dname is None or arr.dtype != DTYPES[dname]:  # e.g. big-endian: encode() converts it
                self._key = None
                return False
            descriptors.append([name, dname, list(arr.shape)])
        self._prefix = insert_header_prefix(table, sender, descriptors)
        self._key = key
        return True
