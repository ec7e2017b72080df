"""Encode+decode of transition batches: rlfleet's codec against pickle, same run.

    .venv/bin/python -m bench.wire.codec

Cases: 256 CartPole transitions (obs 4xf32, action i64, reward f32,
next_obs 4xf32, done bool) and 32 Atari transitions (84x84x4 uint8 obs and
next_obs, plus the same scalars). Ours is encode() to frames then decode()
of those frames (what crosses a socket); the peer is pickle.dumps/loads
(protocol 5, the fastest) of the same dict of arrays. Timings are the median
of several rounds, interleaved so machine noise hits both alike.
Last line: JSON with microseconds per round trip and ratio = ours / pickle.
"""

from __future__ import annotations

import json
import pickle  # the peer being measured; never used on the wire
import statistics
import time
from collections.abc import Callable

import numpy as np

from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.decoder import decode


def batch(n: int, obs_shape: tuple[int, ...], obs_dtype: type) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    obs: np.ndarray = (rng.random((n, *obs_shape)) * 255).astype(obs_dtype)
    return {
        "obs": obs,
        "action": rng.integers(0, 4, n).astype(np.int64),
        "reward": rng.random(n).astype(np.float32),
        "next_obs": (rng.random((n, *obs_shape)) * 255).astype(obs_dtype),
        "done": rng.random(n) < 0.05,
    }


def ours(arrays: dict[str, np.ndarray]) -> Callable[[], object]:
    def run() -> object:
        frames = encode(Message("insert", {"table": "main"}, arrays, sender="actor-0", seq=1))
        return decode(frames)

    return run


def peer(arrays: dict[str, np.ndarray]) -> Callable[[], object]:
    def run() -> object:
        return pickle.loads(pickle.dumps(arrays, protocol=5))

    return run


def per_call_us(fn: Callable[[], object], seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(20):
            fn()
        n += 20
    return elapsed / n * 1e6


def measure(arrays: dict[str, np.ndarray], rounds: int = 7, seconds: float = 0.3) -> tuple[float, float]:
    a, b = ours(arrays), peer(arrays)
    for fn in (a, b):
        per_call_us(fn, 0.1)  # warm up
    ours_us, pickle_us = [], []
    for _ in range(rounds):
        ours_us.append(per_call_us(a, seconds))
        pickle_us.append(per_call_us(b, seconds))
    return statistics.median(ours_us), statistics.median(pickle_us)


def main() -> None:
    result: dict[str, float] = {}
    cases = {"cartpole_256": batch(256, (4,), np.float32), "atari_32": batch(32, (84, 84, 4), np.uint8)}
    for name, arrays in cases.items():
        mine, theirs = measure(arrays)
        nbytes = sum(a.nbytes for a in arrays.values())
        print(f"{name}: {nbytes} bytes  ours {mine:.1f} us  pickle {theirs:.1f} us  ratio {mine / theirs:.2f}")
        result[f"{name}_ours_us"] = round(mine, 2)
        result[f"{name}_pickle_us"] = round(theirs, 2)
        result[f"{name}_ratio"] = round(mine / theirs, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
