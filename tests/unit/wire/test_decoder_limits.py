"""The decoder's limits hold exactly, its refusals say what is wrong, and what it hands out cannot mislead.

Each limit is probed at its value (accepted) and one past it (refused); each refusal's detail is
compared whole, as a client's author reads it; frames of any bytes-like kind decode by their size in
bytes; a layout remembered from an earlier message is never trusted under other limits or for
descriptors that only compare equal. Mutation testing (docs/testing.md) found each case missing.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from rlfleet.common.wire.codec import DTYPES, PROTOCOL_VERSION, Limits, Message, ProtocolError, encode
from rlfleet.common.wire.decoder import decode


def header(**kw: object) -> bytes:
    base: dict[str, object] = {
        "v": PROTOCOL_VERSION, "type": "info", "sender": "t", "seq": 1, "arrays": [], "body": {},
    }
    base.update(kw)
    return msgpack.packb(base)


def insert(arrays: list[list[object]], **kw: object) -> bytes:
    return header(type="insert", body={"table": "t"}, arrays=arrays, **kw)


def refusal(frames: list[object], limits: Limits | None = None) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(frames, limits) if limits else decode(frames)
    return info.value


def nested(depth: int) -> object:
    """An int under ``depth`` lists."""
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def test_the_header_may_be_exactly_max_header_bytes() -> None:
    frame = header()
    decode([frame], Limits(max_header_bytes=len(frame)))
    err = refusal([frame], Limits(max_header_bytes=len(frame) - 1))
    assert (err.reason, err.detail) == ("header_too_large", f"header is {len(frame)} bytes; at most {len(frame) - 1}")


def test_header_arrays_and_maps_may_hold_exactly_max_header_items() -> None:
    limits = Limits(max_header_items=8)
    decode([header(body={"pad": list(range(8)), "map": {str(i): i for i in range(8)}})], limits)
    assert refusal([header(body={"pad": list(range(9))})], limits).reason == "bad_msgpack"
    assert refusal([header(body={"map": {str(i): i for i in range(9)}})], limits).reason == "bad_msgpack"


def test_msgpack_ext_types_and_non_string_keys_are_refused() -> None:
    for bad in (msgpack.ExtType(5, b""), msgpack.ExtType(5, b"zz")):
        err = refusal([header(sender=bad)])
        assert (err.reason, err.detail) == ("bad_msgpack", "header is not valid msgpack (ValueError)")
    assert refusal([header(body={1: 2})]).reason == "bad_msgpack"
    err = refusal([msgpack.packb([1, 2])])
    assert (err.reason, err.detail) == ("bad_header", "header must be a map, got list")


def test_a_body_value_may_nest_exactly_four_levels() -> None:
    """Unknown fields are ignored, but their depth is bounded, as a known field's is."""
    decode([header(body={"future": nested(4), "other": {"a": {"b": {"c": {"d": 1}}}}})])
    decode([header(type="info_reply", body={"ref_seq": 1, "service": "replay", "shard": 0,
                                            "stats": {"a": {"b": {"c": {"d": 1}}}}})])
    err = refusal([header(body={"future": nested(5)})])
    assert (err.reason, err.detail) == ("bad_field", "info.future is nested deeper than 4 levels")
    err = refusal([header(body={"future": {"a": {"b": {"c": {"d": {"e": 1}}}}}})])
    assert (err.reason, err.detail) == ("bad_field", "info.future is nested deeper than 4 levels")
    err = refusal([header(type="info_reply", body={"ref_seq": 1, "service": "replay", "shard": 0,
                                                   "stats": {"a": {"b": {"c": {"d": {"e": 1}}}}}})])
    assert (err.reason, err.detail) == ("bad_field", "info_reply.stats is nested deeper than 4 levels")


@pytest.mark.parametrize(("key", "value", "kind"), [
    ("type", 5, "str"), ("sender", b"t", "str"), ("seq", "1", "int"), ("seq", True, "int"), ("seq", 1.0, "int"),
    ("arrays", {}, "list"), ("body", [], "dict"),
])
def test_each_header_field_of_the_wrong_type_is_named(key: str, value: object, kind: str) -> None:
    err = refusal([header(**{key: value})])
    assert (err.reason, err.detail) == ("bad_field", f"header.{key} must be {kind}, got {type(value).__name__}")


@pytest.mark.parametrize("key", ["type", "sender", "seq", "arrays", "body"])
def test_each_missing_header_field_is_named(key: str) -> None:
    fields = {"v": PROTOCOL_VERSION, "type": "info", "sender": "t", "seq": 1, "arrays": [], "body": {}}
    del fields[key]
    err = refusal([msgpack.packb(fields)])
    assert (err.reason, err.detail) == ("missing_field", f"header.{key} is missing")


def test_the_version_is_checked_first_and_named() -> None:
    err = refusal([msgpack.packb({"type": "info"})])
    assert (err.reason, err.detail) == ("missing_field", "header.v (protocol version, int) is missing")
    for bad in (True, "2", float(PROTOCOL_VERSION)):
        err = refusal([header(v=bad)])
        assert err.reason == "version_mismatch"
        assert f"this side speaks protocol version {PROTOCOL_VERSION}" in err.detail
    err = refusal([header(v=PROTOCOL_VERSION + 1)])
    assert err.detail == f"message speaks protocol version {PROTOCOL_VERSION + 1}; this side speaks {PROTOCOL_VERSION}"


def test_seq_0_is_a_valid_seq_and_an_errors_ref_seq() -> None:
    assert decode([header(seq=0)]).seq == 0
    assert refusal([header(seq=0, type="teleport")]).seq == 0
    err = refusal([header(seq=-1)])
    assert (err.detail, err.seq) == ("header.seq must be in [0, 2**64)", -1)
    assert refusal([header(seq="1")]).seq == -1
    assert refusal([b"\xc1"]).seq == -1


def test_the_sender_may_be_exactly_256_characters() -> None:
    assert decode([header(sender="s" * 256)]).sender == "s" * 256
    err = refusal([header(sender="s" * 257)])
    assert (err.reason, err.detail) == ("bad_field", "header.sender is longer than 256 characters")


def test_an_empty_sender_is_refused_saying_why_it_is_needed() -> None:
    err = refusal([insert([["x", "uint8", [1]]], sender=""), bytes(1)])
    assert err.reason == "bad_field"
    assert err.detail == ("header.sender of insert is empty; allowed: 1 to 256 characters, the sender's own id "
                          "((sender, seq) is what makes it exactly-once)")


@pytest.mark.parametrize("packed", [False, True])
def test_a_decoded_message_carries_its_header(packed: bool) -> None:
    out = decode([insert([["x", "uint8", [2]]], packed=packed, sender="a", seq=7), bytes(2)])
    assert (out.type, out.sender, out.seq, out.body) == ("insert", "a", 7, {"table": "t"})
    assert out.version == PROTOCOL_VERSION
    assert out.arrays["x"].tolist() == [0, 0]


def test_an_unknown_type_is_named_with_the_known_ones() -> None:
    err = refusal([header(type="teleport")])
    assert err.reason == "unknown_type" and err.detail.startswith("message type 'teleport' is not defined; known: [")


def test_an_array_name_may_be_exactly_max_name_chars() -> None:
    limits = Limits(max_name_chars=5)
    payload = np.zeros(2, np.float32).tobytes()
    assert list(decode([insert([["abcde", "float32", [2]]]), payload], limits).arrays) == ["abcde"]
    for name in ("abcdef", "", 5):
        err = refusal([insert([[name, "float32", [2]]]), payload], limits)
        assert (err.reason, err.detail) == ("bad_array_descriptor", "array name must be a non-empty string")


@pytest.mark.parametrize("item", [["x", "float32"], ["x", "float32", [2], 0], "x", None, {"x": 1}])
def test_an_array_descriptor_must_be_a_list_of_three(item: object) -> None:
    err = refusal([insert([item]), bytes(8)])
    assert (err.reason, err.detail) == ("bad_array_descriptor", "each header.arrays item must be [name, dtype, shape]")


@pytest.mark.parametrize("dtype", ["object", "float128", "FLOAT32", ["float32"], 5, None])
def test_a_dtype_outside_the_allowlist_is_named_with_the_allowlist(dtype: object) -> None:
    err = refusal([insert([["x", dtype, [2]]]), bytes(8)])
    assert (err.reason, err.detail) == ("bad_dtype", f"array 'x': dtype {dtype!r} is not allowed; allowed: "
                                                     f"{sorted(DTYPES)}")


def test_an_array_may_have_exactly_max_ndim_dims() -> None:
    limits = Limits(max_ndim=3)
    assert decode([insert([["x", "uint8", [1, 2, 1]]]), bytes(2)], limits).arrays["x"].shape == (1, 2, 1)
    for shape in ([1, 1, 1, 1], 1, "1", {"1": 1}):
        err = refusal([insert([["x", "uint8", shape]]), bytes(1)], limits)
        assert (err.reason, err.detail) == ("bad_shape", "array 'x': shape must be a list of at most 3 ints")


@pytest.mark.parametrize("shape", [[1 << 62], [-1], [2.0], [True], ["2"], [None], [1, [2]]])
def test_each_dim_must_be_an_int_in_0_to_2_62(shape: list[object]) -> None:
    err = refusal([insert([["x", "uint8", shape]]), bytes(2)])
    assert (err.reason, err.detail) == ("bad_shape", f"array 'x': shape {shape!r} must hold non-negative ints")


def test_an_array_may_have_exactly_max_array_elements() -> None:
    limits = Limits(max_array_elements=6)
    assert decode([insert([["x", "int16", [2, 3]]]), bytes(12)], limits).arrays["x"].shape == (2, 3)
    err = refusal([insert([["x", "int16", [7]]]), bytes(14)], limits)
    assert (err.reason, err.detail) == ("too_many_elements", "array 'x': 7 elements; at most 6")
    err = refusal([insert([["x", "uint8", [(1 << 62) - 1]]]), b""])  # a valid dim, far too many elements
    assert err.reason == "too_many_elements"


def test_a_message_may_have_exactly_max_frames_and_max_message_bytes() -> None:
    frames = [insert([["a", "uint8", [3]], ["b", "uint8", [4]]]), bytes(3), bytes(4)]
    size = sum(map(len, frames))
    decode(frames, Limits(max_frames=3, max_message_bytes=size))
    err = refusal(frames, Limits(max_frames=2))
    assert (err.reason, err.detail) == ("too_many_frames", "3 frames; at most 2")
    err = refusal(frames, Limits(max_message_bytes=size - 1))
    assert (err.reason, err.detail) == ("message_too_large", f"{size} bytes; at most {size - 1}")
    err = refusal([])
    assert (err.reason, err.detail) == ("empty_message", "a message needs at least a header frame")


def test_frames_that_are_not_bytes_like_are_refused() -> None:
    for bad in (5, None, "text"):
        err = refusal([header(), bad])
        assert (err.reason, err.detail) == ("bad_header", "frames must be bytes-like")


def test_frames_of_any_buffer_kind_decode_by_their_size_in_bytes() -> None:
    """bytearray, memoryviews of any format and shape, numpy arrays: len() of those is not always bytes."""
    values = np.arange(4, dtype=np.float32)
    head = insert([["x", "float32", [2, 2]]])
    for frame in (bytearray(values.tobytes()), memoryview(values), memoryview(values.view(np.uint8).reshape(2, 8)),
                  values, memoryview(values.tobytes())):
        out = decode([bytearray(head), frame])
        np.testing.assert_array_equal(out.arrays["x"], values.reshape(2, 2))
        assert not out.arrays["x"].flags.writeable  # a view of the caller's frame: never written through
    packed = [bytearray(insert([["x", "float32", [4]]], packed=True)), bytearray(values.tobytes())]
    out = decode(packed)
    np.testing.assert_array_equal(out.arrays["x"], values)
    assert not out.arrays["x"].flags.writeable


def test_frame_count_and_length_refusals_say_what_came() -> None:
    err = refusal([insert([["x", "float32", [2, 2]], ["y", "uint8", [1]]]), bytes(16)])
    assert (err.reason, err.detail) == ("frame_count_mismatch", "header describes 2 arrays but 1 payload frames came")
    err = refusal([insert([["x", "float32", [2, 2]]]), bytes(15)])
    assert (err.reason, err.detail) == ("frame_length_mismatch", "array 'x': frame has 15 bytes, shape [2, 2] x 4 "
                                                                 "needs 16")
    err = refusal([insert([["x", "uint8", [1]]], packed=True), bytes(1), bytes(1)])
    assert (err.reason, err.detail) == ("frame_count_mismatch", "a packed message has exactly one payload frame; "
                                                                "2 came")
    err = refusal([insert([["a", "uint8", [3]], ["b", "float32", [2]]], packed=True), bytes(15)])
    assert (err.reason, err.detail) == ("frame_length_mismatch", "packed payload frame has 15 bytes; its 2 arrays "
                                                                 "(each at a multiple of 8 bytes) need 16")
    err = refusal([insert([["x", "uint8", [1]]], packed=1), bytes(1)])
    assert (err.reason, err.detail) == ("bad_field", "header.packed must be bool, got int")
    assert decode([insert([["x", "uint8", [1]]], packed=False), bytes(1)]).arrays["x"].tolist() == [0]


@pytest.mark.parametrize("packed", [False, True])
def test_a_duplicate_array_name_is_named(packed: bool) -> None:
    frames = [insert([["x", "uint8", [1]], ["x", "uint8", [1]]], packed=packed), bytes(1)]
    err = refusal(frames if packed else [*frames, bytes(1)])
    assert (err.reason, err.detail) == ("bad_array_descriptor", "array 'x' appears twice")


@pytest.mark.parametrize("packed", [False, True])
def test_a_remembered_layout_is_not_trusted_under_other_limits(packed: bool) -> None:
    """A layout cached under generous limits is checked again under strict ones."""
    frames = [insert([["n1", "uint8", [4]], ["n2", "uint8", [4]], ["n3", "uint8", [4]]], packed=packed)]
    frames += [bytes(20)] if packed else [bytes(4)] * 3
    generous, strict = Limits(), Limits(max_array_elements=3)
    decode(frames, generous)
    decode(frames, generous)
    assert refusal(frames, strict).reason == "too_many_elements"
    decode(frames, generous)


@pytest.mark.parametrize("packed", [False, True])
def test_a_remembered_layout_is_not_trusted_for_dims_that_only_compare_equal(packed: bool) -> None:
    """``[4.0] == [4]`` and ``[True] == [1]``: such dims are refused even right after a valid layout."""
    for bad in ([1.0, 4], [True, 4], [1, 4.0]):
        good = [insert([["m1", "uint8", [4]], ["m2", "uint8", [1, 4]]], packed=packed)]
        good += [bytes(12)] if packed else [bytes(4), bytes(4)]
        decode(good)
        frames = [insert([["m1", "uint8", [4]], ["m2", "uint8", bad]], packed=packed), *good[1:]]
        assert refusal(frames).reason == "bad_shape"


@pytest.mark.parametrize("packed", [False, True])
def test_a_new_layout_of_as_many_arrays_is_read_as_it_says(packed: bool) -> None:
    """Each message's shapes are its own, and its frame lengths are checked, layout remembered or not."""
    values = np.arange(6, dtype=np.int16)
    for shape in ([2, 3], [3, 2], [6], [1, 6], [2, 3]):
        head = insert([["k", "int16", shape], ["k2", "uint8", [2]]], packed=packed)
        payload = [values.tobytes() + bytes(4 + 2)] if packed else [values.tobytes(), bytes(2)]  # k2 at 16
        out = decode([head, *payload])
        assert out.arrays["k"].shape == tuple(shape)
        np.testing.assert_array_equal(out.arrays["k"].ravel(), values)
        short = [payload[0][:-1]] if packed else [payload[0][:-2], payload[1]]
        err = refusal([head, *short])  # right after a valid message of this layout
        assert err.reason == "frame_length_mismatch"
        if not packed:
            assert err.detail == f"array 'k': frame has 10 bytes, shape {shape} x 2 needs 12"


def test_packed_messages_of_one_layout_share_one_layout_object() -> None:
    """A receiver may remember what it checked of a layout by ``is`` (Message.layout)."""
    def packed(shape: list[int]) -> list[object]:
        end = 4 * shape[0]
        return [insert([["p1", "float32", shape], ["p2", "uint8", [3]]], packed=True), bytes(end + -end % 8 + 3)]

    first, second = decode(packed([2])), decode(packed([2]))
    assert first.layout is not None and first.layout is second.layout
    other = decode(packed([3]))
    assert other.layout is not None and other.layout is not first.layout
    assert decode(encode(Message("insert", {"table": "t"}, {"x": np.zeros(2)}, sender="s"))).layout is None


def test_each_body_field_is_checked_after_an_absent_optional_one() -> None:
    """sample's timeout_ms is optional; rate_limited after it is still checked."""
    body = {"table": "main", "batch_size": 4, "rate_limited": "yes"}
    err = refusal([header(type="sample", body=body)])
    assert (err.reason, err.detail) == ("bad_field", "sample.rate_limited must be bool or nil, got str")
    assert decode([header(type="sample", body={**body, "rate_limited": None})]).body["rate_limited"] is None
    err = refusal([header(type="sample", body={"table": "main"})])
    assert (err.reason, err.detail) == ("missing_field", "sample.batch_size is required")
    body = {"table": "main", "batch_size": 4, "timeout_ms": 1.5}
    err = refusal([header(type="sample", body=body)])
    assert (err.reason, err.detail) == ("bad_field", "sample.timeout_ms must be int or nil, got float")


def test_body_fields_of_every_plain_kind_pass_and_fail_alike() -> None:
    ok = {"ref_seq": 3, "service": "replay", "shard": 0, "stats": {"a": 1.5}}
    assert decode([header(type="info_reply", body=ok)]).body == ok
    for name, bad in (("ref_seq", 1.5), ("ref_seq", True), ("service", 5), ("stats", [1])):
        err = refusal([header(type="info_reply", body={**ok, name: bad})])
        assert err.reason == "bad_field" and err.detail.startswith(f"info_reply.{name} must be ")
    ack = {"ref_seq": 3, "stored": 1, "duplicate": False}
    assert decode([header(type="ack", body=ack)]).body["duplicate"] is False
    err = refusal([header(type="ack", body={**ack, "duplicate": 0})])
    assert (err.reason, err.detail) == ("bad_field", "ack.duplicate must be bool, got int")


def test_array_refusals_name_the_message_and_the_array() -> None:
    keys = ["key", "uint64", [2]]
    err = refusal([header(type="priorities", body={"table": "t"}, arrays=[keys]), bytes(16)])
    assert (err.reason, err.detail) == ("missing_array", "priorities needs array 'priority'")
    err = refusal([header(type="priorities", body={"table": "t"}, arrays=[keys, ["priority", "float32", [1, 2]]]),
                   bytes(16), bytes(8)])
    assert (err.reason, err.detail) == ("bad_shape", "priorities.priority must have 1 dims, got 2")
    err = refusal([header(type="priorities", body={"table": "t"}, arrays=[keys, ["priority", "int32", [2]]]),
                   bytes(16), bytes(8)])
    assert (err.reason, err.detail) == ("bad_dtype", "priorities.priority must have dtype in ['float32', "
                                                     "'float64'], got int32")
    err = refusal([header(type="get", body={"have_version": 1}, arrays=[["zz", "uint8", [1]]]), bytes(1)])
    assert (err.reason, err.detail) == ("unexpected_array", "get takes no array named 'zz'")
    out = decode([header(type="priorities", body={"table": "t"}, arrays=[keys, ["priority", "float64", [2]]]),
                  bytes(16), bytes(16)])
    assert sorted(out.arrays) == ["key", "priority"]
