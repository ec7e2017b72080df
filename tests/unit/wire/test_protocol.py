"""The codec: round trips, zero-copy, and a named rejection for every bad input."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.mutation import examples
from rlfleet.common.wire.codec import (
    DTYPES,
    PACK_ALIGN,
    PROTOCOL_VERSION,
    REASONS,
    Limits,
    Message,
    ProtocolError,
    encode,
)
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.inserts import InsertEncoder, insert_header_prefix, read_insert_tail


def wire(msg: Message) -> list[bytes]:
    return [bytes(f) for f in encode(msg)]


def header(**kw: object) -> bytes:
    base: dict[str, object] = {
        "v": PROTOCOL_VERSION, "type": "info", "sender": "t", "seq": 1, "arrays": [], "body": {},
    }
    base.update(kw)
    return msgpack.packb(base)


def reason_of(frames: list[bytes], limits: Limits | None = None) -> str:
    with pytest.raises(ProtocolError) as info:
        decode(frames, limits) if limits else decode(frames)
    return info.value.reason


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_every_allowed_dtype_round_trips(dtype: str) -> None:
    rng = np.random.default_rng(0)
    arr = (rng.random((3, 5)) * 100).astype(dtype)
    out = decode(wire(Message("insert", {"table": "t"}, {"x": arr}, sender="s")))
    assert out.arrays["x"].dtype == np.dtype(dtype).newbyteorder("<")
    np.testing.assert_array_equal(out.arrays["x"], arr)


def test_non_contiguous_and_big_endian_arrays_encode_correctly() -> None:
    base = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    views = {
        "sliced": base[:, ::2, 1:],
        "transposed": base.T,
        "fortran": np.asfortranarray(base),
        "big": np.arange(6, dtype=">i4").reshape(2, 3),
        "empty": np.zeros((0, 4), np.uint8),
        "scalar": np.array(7.5),
    }
    out = decode(wire(Message("insert", {"table": "t"}, views, sender="a", seq=9)))
    assert (out.sender, out.seq, out.body) == ("a", 9, {"table": "t"})
    for name, arr in views.items():
        assert out.arrays[name].shape == arr.shape
        np.testing.assert_array_equal(out.arrays[name], arr)


def test_decode_is_zero_copy_over_zmq_frames() -> None:
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://zero-copy")
    b.connect("inproc://zero-copy")
    try:
        big = np.arange(100_000, dtype=np.float32)
        a.send_multipart(encode(Message("insert", {"table": "t"}, {"x": big}, sender="s")), copy=False)
        frames = b.recv_multipart(copy=False)
        out = decode(frames)
        assert np.shares_memory(out.arrays["x"], np.frombuffer(frames[1].buffer, np.uint8))
        assert not out.arrays["x"].flags.writeable
        np.testing.assert_array_equal(out.arrays["x"], big)
    finally:
        a.close(0)
        b.close(0)


def test_unknown_body_fields_are_ignored() -> None:
    out = decode([header(type="get", body={"have_version": 3, "future_field": [1, {"x": 2}]})])
    assert out.body["have_version"] == 3


GOOD_ARR = [["x", "float32", [2, 2]]]
GOOD_PAYLOAD = np.zeros((2, 2), np.float32).tobytes()


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "empty_message"),
        ([header()] + [b""] * 64, "too_many_frames"),
        ([b"\xc1"], "bad_msgpack"),
        ([b"\x92\x01"], "bad_msgpack"),  # truncated array
        ([msgpack.packb([1, 2])], "bad_header"),
        ([msgpack.packb({"type": "info"})], "missing_field"),
        ([header(v=PROTOCOL_VERSION + 1)], "version_mismatch"),
        ([header(type="teleport")], "unknown_type"),
        ([header(seq=-1)], "bad_field"),
        ([header(seq="1")], "bad_field"),
        ([header(body=[])], "bad_field"),
        ([header(type="get", body={})], "missing_field"),
        ([header(type="get", body={"have_version": "3"})], "bad_field"),
        ([header(type="get", body={"have_version": True})], "bad_field"),
        ([header(type="insert", body={"table": "t"}, arrays=GOOD_ARR)], "frame_count_mismatch"),
        ([header(type="insert", body={"table": "t"}, arrays=GOOD_ARR), GOOD_PAYLOAD[:-1]],
         "frame_length_mismatch"),
        ([header(type="insert", body={"table": "t"}, arrays=GOOD_ARR), GOOD_PAYLOAD + b"\0"],
         "frame_length_mismatch"),
        ([header(type="insert", body={"table": "t"}, arrays=[["x", "object", [1]]]), b"\0" * 8],
         "bad_dtype"),
        ([header(type="insert", body={"table": "t"}, arrays=[["x", "complex64", [1]]]), b"\0" * 8],
         "bad_dtype"),
        ([header(type="insert", body={"table": "t"}, arrays=[["x", "float32", [-1]]]), b""],
         "bad_shape"),
        ([header(type="insert", body={"table": "t"}, arrays=[["x", "uint8", [1] * 9]]), b"\0"],
         "bad_shape"),
        ([header(type="insert", body={"table": "t"}, arrays=[["x", "uint8", [1 << 40, 1 << 40]]]), b""],
         "too_many_elements"),
        ([header(type="insert", body={"table": "t"}, arrays=[["x", "float32"]]), b""],
         "bad_array_descriptor"),
        ([header(type="insert", body={"table": "t"}, arrays=GOOD_ARR * 2), GOOD_PAYLOAD, GOOD_PAYLOAD],
         "bad_array_descriptor"),
        ([header(type="priorities", body={"table": "t"})], "missing_array"),
        ([header(type="get", body={"have_version": 1}, arrays=GOOD_ARR), GOOD_PAYLOAD], "unexpected_array"),
        ([header(type="priorities", body={"table": "t"},
                 arrays=[["key", "float32", [1]], ["priority", "float32", [1]]]), b"\0" * 4, b"\0" * 4],
         "bad_dtype"),
    ],
)
def test_bad_input_gets_its_reason(frames: list[bytes], reason: str) -> None:
    assert reason_of(frames) == reason


def test_size_limits() -> None:
    limits = Limits(max_header_bytes=100, max_message_bytes=1000)
    assert reason_of([header(body={"pad": "x" * 200})], limits) == "header_too_large"
    frames = [header(type="insert", body={"table": "t"}, arrays=[["x", "uint8", [2000]]]), b"\0" * 2000]
    assert reason_of(frames, Limits(max_message_bytes=1000)) == "message_too_large"


def test_deep_nesting_and_ext_types_are_refused() -> None:
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    assert reason_of([header(body={"x": deep})]) == "bad_field"
    ext = msgpack.packb({"v": PROTOCOL_VERSION, "type": "info", "sender": msgpack.ExtType(5, b"zz"), "seq": 1})
    assert reason_of([ext]) == "bad_msgpack"
    very_deep = b"\x91" * 30_000 + b"\x01"  # 30k nested one-element arrays
    assert reason_of([very_deep]) in ("bad_msgpack", "bad_header")


def test_packed_messages_round_trip_with_aligned_arrays() -> None:
    arrays = {
        "a": np.arange(3, dtype=np.uint8),
        "b": np.array([1.5, -2.0], np.float32),
        "empty": np.zeros((0, 4), np.float64),
        "sliced": np.arange(24, dtype=">i8").reshape(4, 6)[:, ::2],
        "scalar": np.array(True),
        "last": np.arange(5, dtype=np.int16),
    }
    frames = encode(Message("insert", {"table": "t"}, arrays, sender="s", seq=3), packed=True)
    assert len(frames) == 2
    # a 0..3, b 8..16, empty 16..16, sliced 16..112, scalar 112..113, last 120..130
    assert len(frames[1]) == 130
    out = decode([bytes(f) for f in frames])
    assert (out.type, out.sender, out.seq, out.body) == ("insert", "s", 3, {"table": "t"})
    assert list(out.arrays) == list(arrays)
    for name, arr in arrays.items():
        got = out.arrays[name]
        assert got.shape == arr.shape and got.dtype == arr.dtype.newbyteorder("<")
        np.testing.assert_array_equal(got, arr)
        assert not got.flags.writeable
        if got.size:
            assert got.ctypes.data % PACK_ALIGN == np.frombuffer(frames[1], np.uint8).ctypes.data % PACK_ALIGN
    assert frames[1][3:8] == bytes(5)  # padding after "a" is zero


PACKED_ARR = [["a", "uint8", [3]], ["b", "float32", [2]]]
PACKED_PAYLOAD = bytes(3) + bytes(5) + np.ones(2, np.float32).tobytes()


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([header(type="insert", body={"table": "t"}, arrays=PACKED_ARR, packed=True)], "frame_count_mismatch"),
        ([header(type="insert", body={"table": "t"}, arrays=PACKED_ARR, packed=True), PACKED_PAYLOAD, b""],
         "frame_count_mismatch"),
        ([header(type="insert", body={"table": "t"}, arrays=PACKED_ARR, packed=True), PACKED_PAYLOAD[:-1]],
         "frame_length_mismatch"),
        ([header(type="insert", body={"table": "t"}, arrays=PACKED_ARR, packed=True), PACKED_PAYLOAD + b"\0"],
         "frame_length_mismatch"),
        ([header(type="insert", body={"table": "t"}, arrays=PACKED_ARR, packed=True), bytes(3 + 8)],
         "frame_length_mismatch"),  # unaligned: b must start at 8, not 3
        ([header(type="insert", body={"table": "t"}, arrays=PACKED_ARR, packed=1), PACKED_PAYLOAD], "bad_field"),
        ([header(type="insert", body={"table": "t"}, arrays=[["x", "object", [1]]], packed=True), b"\0" * 8],
         "bad_dtype"),
        ([header(type="insert", body={"table": "t"}, arrays=[["x", "uint8", [1 << 40, 1 << 40]]], packed=True),
          b""], "too_many_elements"),
        ([header(type="insert", body={"table": "t"}, arrays=PACKED_ARR[:1] * 2, packed=True), bytes(11)],
         "bad_array_descriptor"),
        ([header(type="priorities", body={"table": "t"}, arrays=PACKED_ARR, packed=True), PACKED_PAYLOAD],
         "missing_array"),
    ],
)
def test_bad_packed_input_gets_its_reason(frames: list[bytes], reason: str) -> None:
    assert reason_of(frames) == reason


def test_packed_layout_cache_still_checks_each_payload() -> None:
    good = [header(type="insert", body={"table": "t"}, arrays=PACKED_ARR, packed=True), PACKED_PAYLOAD]
    assert decode(good).arrays["b"].tolist() == [1.0, 1.0]
    assert reason_of([good[0], PACKED_PAYLOAD[:-4]]) == "frame_length_mismatch"  # same header, short payload
    assert decode(good).arrays["a"].tolist() == [0, 0, 0]


def test_reasons_are_unique() -> None:
    assert len(set(REASONS)) == len(REASONS)


def valid_frames(packed: bool = False) -> list[bytes]:
    arrays = {"obs": np.ones((4, 3), np.float32), "action": np.arange(4), "done": np.zeros(4, bool)}
    msg = Message("insert", {"table": "main"}, arrays, sender="actor-1", seq=5)
    return [bytes(f) for f in encode(msg, packed=packed)]


def _mutate(frames: list[bytes], data: st.DataObject) -> list[bytes]:
    out = list(frames)
    op = data.draw(st.sampled_from(["flip", "truncate", "drop", "add", "swap"]))
    i = data.draw(st.integers(0, len(out) - 1))
    if op == "flip" and out[i]:
        j = data.draw(st.integers(0, len(out[i]) - 1))
        b = bytearray(out[i])
        b[j] ^= data.draw(st.integers(1, 255))
        out[i] = bytes(b)
    elif op == "truncate":
        out[i] = out[i][: data.draw(st.integers(0, len(out[i])))]
    elif op == "drop":
        del out[i]
    elif op == "add":
        out.insert(i, data.draw(st.binary(max_size=64)))
    else:
        j = data.draw(st.integers(0, len(out) - 1))
        out[i], out[j] = out[j], out[i]
    return out


def _check_decode(frames: list[bytes]) -> None:
    try:
        msg = decode(frames)
    except ProtocolError as exc:
        assert exc.reason in REASONS
        return
    # A decode that succeeds must describe exactly the frames it came from.
    if msgpack.unpackb(frames[0]).get("packed") is True:
        assert len(frames) == 2
        end = 0
        for arr in msg.arrays.values():
            start = end + -end % PACK_ALIGN
            end = start + arr.nbytes
            assert arr.tobytes() == frames[1][start:end]
        assert end == len(frames[1])
        return
    assert len(msg.arrays) == len(frames) - 1
    for arr, frame in zip(msg.arrays.values(), frames[1:], strict=True):
        assert arr.nbytes == len(frame)
        assert arr.tobytes() == frame


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=256), max_size=6))
def test_random_frames_decode_or_raise_protocol_error(frames: list[bytes]) -> None:
    _check_decode(frames)


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_valid_messages_decode_or_raise_protocol_error(data: st.DataObject) -> None:
    frames = valid_frames(packed=data.draw(st.booleans()))
    for _ in range(data.draw(st.integers(1, 3))):
        if not frames:
            break
        frames = _mutate(frames, data)
    _check_decode(frames)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=10),
        st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                     max_leaves=20),
        max_size=8,
    )
)
def test_random_headers_decode_or_raise_protocol_error(fields: dict[str, object]) -> None:
    _check_decode([msgpack.packb(fields)])


@given(st.integers(-(2**63), 2**64 - 1), st.integers(-(2**63), 2**64 - 1))
def test_read_insert_tail_reads_what_the_encoder_wrote(ws: int, seq: int) -> None:
    # InsertEncoder's header ends in window_start, the key seq and seq: read_insert_tail gives the
    # two ints (seq in [0, 2**64)) in every msgpack int form, as the full decoder reads them
    cols = {"obs": np.zeros((3, 4), np.float32)}
    head = InsertEncoder().frames("main", cols, "a", seq, ws)[0]
    start = len(insert_header_prefix("main", "a", [["obs", "float32", [3, 4]]]))
    got = read_insert_tail(head, start)
    if seq < 0:
        assert got is None
    else:
        assert got == (ws, seq)
        frames = [head, np.zeros((3, 4), np.float32).tobytes()]
        if ws < 0:  # read here, refused by the decoder (the server's fast path hands it over)
            with pytest.raises(ProtocolError, match="window_start"):
                decode(frames)
        else:
            msg = decode(frames)
            assert (msg.body["window_start"], msg.seq) == got


@pytest.mark.parametrize("tail", [b"", b"\xcf" + bytes(8), b"\xcf" + bytes(8) + b"\xa3seX\xcf" + bytes(8),
                                  b"\xcf" + bytes(8) + b"\xa3seq\xcb" + bytes(8), b"\x01\xa3seq\xc0",
                                  b"\xcf" + bytes(8) + b"\xa3seq\xcf" + bytes(9)])
def test_read_insert_tail_refuses_any_other_tail(tail: bytes) -> None:
    assert read_insert_tail(b"prefix" + tail, 6) is None


@pytest.mark.parametrize("mtype,body,field", [
    ("sample", {"table": "main", "batch_size": 4, "timeout_ms": -1}, "timeout_ms"),
    ("sample", {"table": "main", "batch_size": 4, "timeout_ms": -(2**63)}, "timeout_ms"),
    ("get", {"have_version": -2}, "have_version"),
    ("wait", {"min_version": -7, "timeout_ms": 10}, "min_version"),
])
def test_out_of_range_ints_are_refused_naming_the_field(mtype: str, body: dict[str, object], field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(encode(Message(mtype, body, sender="s", seq=1)))
    assert info.value.reason == "bad_field" and f"{mtype}.{field}" in info.value.detail and "allowed" in \
        info.value.detail
    assert info.value.seq == 1  # readable: the error's ref_seq


def test_an_empty_sender_is_refused_where_it_names_the_message() -> None:
    """(sender, seq) makes an insert or a push exactly-once: an empty sender would share every seq."""
    for mtype, body in (("insert", {"table": "t"}), ("push_gradients", {"version": 0, "num_shards": 1,
                                                                        "layout": "x"})):
        with pytest.raises(ProtocolError, match="bad_field") as err:
            decode(wire(Message(mtype, body, {"x": np.zeros(2, np.float32)}, sender="", seq=1)))
        assert "header.sender" in str(err.value) and "1 to 256" in str(err.value)
    assert decode(wire(Message("info", sender=""))).sender == ""  # a request that names nothing may omit it
