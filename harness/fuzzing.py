"""Malformed messages for the fuzz test: each one must cost the server exactly one protocol error.

Two kinds, told apart by the local decoder (the server's own):

- malformed on the wire: random frames, truncated and byte-flipped valid
  messages, valid headers with one envelope/body/array field broken, random
  msgpack headers, too many frames, oversized headers. Each candidate is run
  through :func:`rlfleet.common.wire.decoder.decode` here and kept only if it raises
  ProtocolError, so the server's decoder refuses it too (once, before any
  handler: ``rlfleet_messages_total{type="undecodable"}``).
- well-formed but refused by the server: a type it does not serve, an
  unknown table, a bad batch size, mismatched lengths, a layout for another
  number of shards... (once, by the handler, as RequestError). None of them
  changes server state, and none is an expected outcome the server does not
  count (``busy``, ``timeout``, ``version_gone``).

Anything a mutation turns into a message that decodes (and so might be
served) is dropped, not sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from rlfleet.common.tensor_shards import Layout, tensor_specs
from rlfleet.common.wire.codec import PROTOCOL_VERSION, Message, ProtocolError, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.schema import MESSAGES

#: what a hostile client sends in an int field: each is outside the range of some field
INT_EXTREMES = (0, -1, 1 << 31, (1 << 63) - 1, (1 << 64) - 1, -(1 << 63))

#: error reasons a server does not count as protocol errors: a fuzz message must never get one
UNCOUNTED = frozenset({"busy", "timeout", "version_gone"})

Frames = list[bytes]


def rows(n: int) -> dict[str, np.ndarray]:
    """CartPole-shaped transitions: the schema of every insert here (a refused one may fix it on an empty table)."""
    obs = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
    return {"obs": obs, "action": np.arange(n, dtype=np.int64) % 2, "reward": np.ones(n, np.float32),
            "next_obs": obs + 1, "done": np.zeros(n, bool)}


def _publish(version: int = 1, num_shards: int = 1, layout: str | None = None) -> Message:
    arrays = {"w": np.ones((4, 3), np.float32), "b": np.zeros(3, np.float32)}
    lay = Layout.from_specs(tuple(tensor_specs(arrays)), 1)
    body = {"version": version, "num_shards": num_shards, "layout": layout or lay.fingerprint,
            "tensors": lay.to_wire()}
    return Message("publish", body, lay.slice(arrays, 0))


def valid(service: str) -> list[Message]:
    """Well-formed requests of each type ``service`` serves: the seeds of the mutations."""
    if service == "replay":
        return [
            Message("insert", {"table": "main", "window_start": 1}, rows(4)),
            Message("sample", {"table": "main", "batch_size": 8, "beta": 0.4}),  # beta: protocol 1's, ignored
            Message("priorities", {"table": "main"}, {"key": np.arange(4, dtype=np.uint64),
                                                      "priority": np.ones(4)}),
            Message("info"),
        ]
    return [
        _publish(),
        Message("get", {"have_version": -1, "shm": False}),
        Message("wait", {"min_version": 1, "timeout_ms": 1}),
        Message("hello", {"actor_id": "fuzz", "role": "actor"}),
        Message("heartbeat", {"actor_id": "fuzz", "role": "actor", "version": -1}),
        Message("goodbye", {"actor_id": "fuzz"}),
        Message("barrier", {"round": 0, "timeout_ms": 1}),
        Message("info"),
    ]


def refused(service: str) -> list[Message]:
    """Well-formed messages ``service`` refuses in its handlers (each a counted error, no state change)."""
    if service == "replay":
        return [
            Message("insert", {"table": "nope"}, rows(4)),
            Message("insert", {"table": "main"}, {**rows(4), "probability": np.ones(4)}),  # reserved column
            Message("insert", {"table": "main"}, {**rows(4), "priority": np.ones(3)}),  # wrong length
            Message("sample", {"table": "nope", "batch_size": 8}),
            Message("priorities", {"table": "main"}, {"key": np.arange(4, dtype=np.uint64),
                                                      "priority": np.ones(3)}),
            Message("publish", {"version": 1, "num_shards": 1, "layout": "x", "tensors": []}),
            Message("hello", {"actor_id": "fuzz", "role": "actor"}),
        ]
    return [
        _publish(num_shards=2),
        _publish(layout="0123456789abcdef"),
        Message("hello", {"actor_id": "fuzz", "role": "learner"}),
        Message("heartbeat", {"actor_id": "fuzz", "role": "boss", "version": 0}),
        Message("insert", {"table": "main"}, rows(2)),
        Message("sample", {"table": "main", "batch_size": 8}),
    ]


def _random_value(rng: np.random.Generator, depth: int = 0) -> Any:
    kind = int(rng.integers(0, 8 if depth < 3 else 5))
    if kind == 0:
        return int(rng.integers(-(1 << 62), 1 << 62))
    if kind == 1:
        return float(rng.normal())
    if kind == 2:
        return rng.bytes(int(rng.integers(0, 12))).hex()
    if kind == 3:
        return None
    if kind == 4:
        return rng.bytes(int(rng.integers(0, 12)))
    if kind == 5:
        return [_random_value(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    keys = ["v", "type", "seq", "sender", "arrays", "body", "table", "x"]
    return {str(keys[int(rng.integers(0, len(keys)))]): _random_value(rng, depth + 1)
            for _ in range(int(rng.integers(0, 5)))}


class Fuzzer:
    """Endless malformed messages for one service, reproducible from ``seed``."""

    def __init__(self, service: str, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.seeds = [(m, [bytes(f) for f in encode(m)]) for m in valid(service)]
        self.refusals = [[bytes(f) for f in encode(Message(m.type, m.body, m.arrays, "fuzz", 1))]
                         for m in refused(service)]
        self.mutations: list[Callable[[], Frames]] = [
            self._random_frames, self._truncated, self._flipped, self._broken_field, self._frames_off,
            self._random_header,
        ]
        self.undecodable = 0  # sent messages the decoder refuses
        self.handler_refused = 0  # sent messages a handler refuses
        self.dropped = 0  # mutations that happened to decode: not sent

    def next(self) -> Frames:
        r = self.rng.random()
        if r < 0.05:
            self.handler_refused += 1
            return self.refusals[int(self.rng.integers(0, len(self.refusals)))]
        while True:
            if r < 0.051:
                frames = self._limits()
            else:
                frames = self.mutations[int(self.rng.integers(0, len(self.mutations)))]()
            try:
                decode(frames)
            except ProtocolError:
                self.undecodable += 1
                return frames
            self.dropped += 1
            r = 1.0

    # -- mutations --------------------------------------------------------------------
    def _seed(self) -> tuple[Message, Frames]:
        return self.seeds[int(self.rng.integers(0, len(self.seeds)))]

    def _random_frames(self) -> Frames:
        return [self.rng.bytes(int(self.rng.integers(0, 200))) for _ in range(int(self.rng.integers(1, 5)))]

    def _truncated(self) -> Frames:
        _, frames = self._seed()
        i = int(self.rng.integers(0, len(frames)))
        cut = int(self.rng.integers(0, max(1, len(frames[i]))))
        return [*frames[:i], frames[i][:cut], *frames[i + 1:]]

    def _flipped(self) -> Frames:
        _, frames = self._seed()
        header = bytearray(frames[0])
        for _ in range(int(self.rng.integers(1, 5))):
            header[int(self.rng.integers(0, len(header)))] = int(self.rng.integers(0, 256))
        return [bytes(header), *frames[1:]]

    def _frames_off(self) -> Frames:
        _, frames = self._seed()
        if len(frames) > 1 and self.rng.random() < 0.5:
            i = int(self.rng.integers(1, len(frames)))
            return [*frames[:i], *frames[i + 1:]]  # a payload frame missing
        return [*frames, self.rng.bytes(int(self.rng.integers(0, 64)))]  # one too many

    def _broken_field(self) -> Frames:
        _, frames = self._seed()
        header = msgpack.unpackb(frames[0], raw=False)
        broken: list[Callable[[dict[str, Any]], Any]] = [
            lambda h: h.update(v=int(self.rng.integers(2, 100))),
            lambda h: h.update(v="1"),
            lambda h: h.pop(str(self.rng.choice(["v", "type", "sender", "seq", "arrays", "body"]))),
            lambda h: h.update(type=self.rng.bytes(6).hex()),
            lambda h: h.update(type=int(self.rng.integers(0, 9))),
            lambda h: h.update(seq=-int(self.rng.integers(1, 1 << 40))),
            lambda h: h.update(seq="7"),
            lambda h: h.update(sender="s" * 300),
            lambda h: h.update(sender=None),
            lambda h: h.update(body=[1, 2]),
            lambda h: h.update(arrays={"a": 1}),
            lambda h: h["arrays"].append(["extra", "float32", [1]]),
            lambda h: h["arrays"] and h["arrays"][0].__setitem__(1, "float128"),
            lambda h: h["arrays"] and h["arrays"][0].__setitem__(2, [-1]),
            lambda h: h["arrays"] and h["arrays"][0].__setitem__(2, [1 << 20, 1 << 20]),
            lambda h: h["arrays"] and h["arrays"][0].__setitem__(2, [*h["arrays"][0][2], 2]),
            lambda h: h["arrays"] and h["arrays"][0].__setitem__(0, ""),
            lambda h: h["body"].clear() if h["type"] != "info" else h.update(type="nope"),
            lambda h: h["body"].update({k: [0.5] for k in list(h["body"])[:1]} or {"x": [[[[[[1]]]]]]}),  # type: ignore[list-item]
            self._int_extreme,
        ]
        broken[int(self.rng.integers(0, len(broken)))](header)
        return [msgpack.packb(header, use_bin_type=True), *frames[1:]]

    def _int_extreme(self, header: dict[str, Any]) -> None:
        """One int field of the body (or the seq) at an extreme: refused by the decoder where it is
        outside the field's range (in range, the message decodes and is dropped, not sent)."""
        value = INT_EXTREMES[int(self.rng.integers(0, len(INT_EXTREMES)))]
        spec = MESSAGES.get(header["type"])
        fields = [n for n, f in spec.fields.items() if f.kind == "int"] if spec else []
        if not fields:
            header["seq"] = value
            return
        header["body"][fields[int(self.rng.integers(0, len(fields)))]] = value

    def _random_header(self) -> Frames:
        value = _random_value(self.rng)
        if self.rng.random() < 0.5:  # an envelope around random content reaches deeper checks
            value = {"v": PROTOCOL_VERSION, "type": str(self._seed()[0].type), "sender": "fuzz", "seq": 1,
                     "arrays": [], "body": value if isinstance(value, dict) else {"x": value}}
        return [msgpack.packb(value, use_bin_type=True)]

    def _limits(self) -> Frames:
        if self.rng.random() < 0.5:
            return [b"\x80"] * 65  # too many frames
        return [b"\xc6" + (70_000).to_bytes(4, "big") + b"\0" * 70_000]  # a 70 KB header
