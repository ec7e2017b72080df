"""Poisoned gradient pushes change nothing (issue 42, attack 3): a real shard in a thread, real sockets.

One finite gradient of 1e19 used to be applied: Adam's and RMSprop's state went
Inf (every later push then left the weights exactly as they were) or SGD's
weights went to 1e15, and the checkpoint kept it. A push whose L2 norm exceeds
``paramserver.max_gradient_norm`` is refused; a step that would leave the
weights or the optimizer state non-finite is undone and refused; a checkpoint
never holds a non-finite value and one that does is not restored; a push on a
version the shard never held is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from harness.paramserver_procs import serving
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.config.sections import DEFAULT_MAX_GRADIENT_NORM, GradientsConfig
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.tensor_shards import Layout
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.errors import RemoteError
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.paramserver.shard import ShardServer

SHAPES = {"w": (6, 4), "b": (4,)}


def weights(value: float) -> dict[str, np.ndarray]:
    return {n: np.full(s, value, np.float32) for n, s in SHAPES.items()}


@contextmanager
def shard(cfg: GradientsConfig, checkpoint: Path, **kw: float) -> Iterator[str]:
    server = ShardServer(ServiceMetrics("paramserver", 0), f"tcp://127.0.0.1:{free_tcp_port()}", 0, 1, 30.0,
                         shm=False, gradients=cfg, checkpoint=str(checkpoint), **kw)  # type: ignore[arg-type]
    with serving(server):
        yield server.endpoint


def push(address: str, layout: Layout, version: int, value: float, seq: int, sender: str = "worker/1") -> Message:
    body = {"version": version, "num_shards": 1, "layout": layout.fingerprint}
    with Connection(address, sender, seq_start=seq) as c:
        try:
            return c.request(Message("push_gradients", body, weights(value)), 5.0)
        except RemoteError as exc:
            return Message("error", {"reason": exc.reason, "detail": exc.detail})


def held(address: str) -> tuple[int, dict[str, np.ndarray]]:
    reader = WeightsReader([address], "reader", shm=False)
    try:
        got = reader.get(-1, timeout_s=5)
        assert got is not None
        return got
    finally:
        reader.close()


def publish(address: str, version: int, value: float) -> Layout:
    pub = WeightsPublisher([address], "worker", shm=False)
    try:
        pub.publish(version, weights(value), timeout_s=5)
        return pub.layout_for(weights(value))
    finally:
        pub.close()


@pytest.mark.parametrize("cfg", [GradientsConfig(optimizer="rmsprop", lr=7e-4, alpha=0.99, eps=1e-5),
                                 GradientsConfig(optimizer="adam"), GradientsConfig(optimizer="sgd", lr=0.1)],
                         ids=["rmsprop", "adam", "sgd"])
def test_a_huge_finite_gradient_is_refused_and_training_goes_on(cfg: GradientsConfig, tmp_path: Path) -> None:
    checkpoint = tmp_path / "shard-0.npz"
    with shard(cfg, checkpoint) as address:
        layout = publish(address, 0, 1.0)
        for seq, value in enumerate([1e19, 1e20, -3e38, DEFAULT_MAX_GRADIENT_NORM / 4], start=1):
            reply = push(address, layout, 0, value, seq)  # 28 elements: the last one's norm is above the bound
            assert reply.type == "error" and reply["reason"] == "bad_gradients", (value, reply.body)
            assert "paramserver.max_gradient_norm" in reply["detail"] and "norm" in reply["detail"]
        assert held(address)[0] == 0  # nothing applied
        for seq in range(10, 13):  # and later pushes still move the weights
            reply = push(address, layout, held(address)[0], 0.5, seq)
            assert reply.type == "gradients_ack" and reply["applied"], reply.body
        version, now = held(address)
        assert version == 3 and all(np.isfinite(a).all() and (a < 1.0).all() for a in now.values())
    with np.load(checkpoint) as z:  # written at stop: finite, the three good pushes only
        assert all(np.isfinite(z[k]).all() for k in z.files if k != "meta")


def test_a_step_that_would_overflow_is_undone(tmp_path: Path) -> None:
    # lr 1e38: a gradient of norm ~50 is within the bound but sends weights of 3e38 past float32's range
    cfg = GradientsConfig(optimizer="sgd", lr=1e38)
    with shard(cfg, tmp_path / "shard-0.npz") as address:
        layout = publish(address, 0, 3e38)
        reply = push(address, layout, 0, -10.0, 1)
        assert reply.type == "error" and reply["reason"] == "bad_gradients", reply.body
        assert "non-finite" in reply["detail"]
        version, now = held(address)
        assert version == 0 and all((a == np.float32(3e38)).all() for a in now.values())
        reply = push(address, layout, 0, 1.0, 2)  # the optimizer's state was put back: this one applies
        assert reply.type == "gradients_ack" and reply["applied"], reply.body
        assert all((a == np.float32(3e38) - np.float32(1e38)).all() for a in held(address)[1].values())


def test_a_checkpoint_with_non_finite_values_is_not_restored(tmp_path: Path) -> None:
    checkpoint = tmp_path / "shard-0.npz"
    cfg = GradientsConfig(optimizer="adam")
    with shard(cfg, checkpoint) as address:
        layout = publish(address, 0, 1.0)
        assert push(address, layout, 0, 0.1, 1).type == "gradients_ack"
    with np.load(checkpoint) as z:
        arrays = {k: z[k] for k in z.files}
    opt = next(k for k in arrays if k.startswith("opt/"))
    arrays[opt] = np.full_like(arrays[opt], np.inf)  # as an older paramserver could write it
    np.savez(checkpoint, **arrays)  # type: ignore[arg-type]
    with shard(cfg, checkpoint) as address:
        reader = WeightsReader([address], "reader", shm=False)
        try:
            assert reader.get(-1, timeout_s=5) is None  # nothing restored: the workers publish again
        finally:
            reader.close()


def test_a_push_on_a_version_the_shard_never_held_is_refused(tmp_path: Path) -> None:
    with shard(GradientsConfig(optimizer="sgd", lr=0.1, max_staleness=8), tmp_path / "shard-0.npz") as address:
        layout = publish(address, 3, 1.0)
        for seq, version in enumerate([0, 2, 4], start=1):
            reply = push(address, layout, version, 0.1, seq)
            assert reply.type == "error" and reply["reason"] == "unknown_version", (version, reply.body)
            assert "3 to 3" in reply["detail"]
        reply = push(address, layout, 3, 0.1, 10)
        assert reply.type == "gradients_ack" and reply["staleness"] == 0
