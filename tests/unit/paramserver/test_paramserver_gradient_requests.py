"""GradientRequests with a recording replier: a push applied becomes the default model's next
version (waking its long polls), a barrier round answers every worker at once, and the
checkpoint brings the version back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.paramserver_fakes import SHAPES, RecordingReplier, metrics, peer, publish, request
from rlfleet.common.config.sections import GradientsConfig
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.errors import RequestError
from rlfleet.services.paramserver.gradient_requests import GradientRequests
from rlfleet.services.paramserver.gradients import GradientApplier
from rlfleet.services.paramserver.long_polls import LongPolls
from rlfleet.services.paramserver.registry import Registry
from rlfleet.services.paramserver.shm_versions import ShmVersions
from rlfleet.services.paramserver.weights_requests import WeightsRequests
from rlfleet.services.paramserver.weights_store import WeightsStore

SGD = GradientsConfig(optimizer="sgd", lr=1.0, max_staleness=1)


def parts(path: str | None = None, registry: Registry | None = None) -> tuple[GradientRequests, RecordingReplier]:
    replier, m, store = RecordingReplier(), metrics(), WeightsStore(0, 1)
    weights = WeightsRequests(replier, store, LongPolls(m.waits_parked), ShmVersions(replier.name, 0, False),
                              registry, m)
    return GradientRequests(replier, GradientApplier(SGD, path, 0), store, weights, registry, m), replier


def push(version: int, seq: int, sender: str = "worker/1", barrier: bool = False) -> Message:
    body = {"version": version, "num_shards": 1, "layout": publish(0).body["layout"], "barrier": barrier}
    return Message("push_gradients", body, {n: np.ones(s, np.float32) for n, s in SHAPES.items()},
                   sender=sender, seq=seq)


def test_a_push_before_any_weights_is_refused() -> None:
    g, replier = parts()
    g.on_push_gradients(peer("worker"), push(0, 1))
    [(_, mtype, body, _)] = replier.sent
    assert (mtype, body["reason"]) == ("error", "no_weights")


def test_an_applied_push_is_the_next_version_and_wakes_its_readers() -> None:
    g, replier = parts()
    g.weights.on_publish(peer("learner"), publish(0, value=5))
    g.weights.on_wait(peer("actor"), request("wait", "actor", min_version=1, timeout_ms=60_000))
    g.on_push_gradients(peer("worker"), push(0, 1))
    assert replier.types()[1:] == [(b"actor", "weights"), (b"worker", "gradients_ack")]
    assert replier.sent[-1][2]["applied"] and g.store.versions == [1, 0]
    assert float(g.store.default.held[0].arrays["w"][0, 0]) == 4.0  # 5 - lr * 1


def test_a_stale_push_is_refused_without_counting_a_protocol_error() -> None:
    g, replier = parts()
    g.weights.on_publish(peer("learner"), publish(0))
    for seq in (1, 2):
        g.on_push_gradients(peer("worker"), push(g.store.versions[0], seq))
    g.on_push_gradients(peer("worker"), push(0, 3))  # 2 versions behind; allowed: 1
    assert replier.sent[-1][2]["reason"] == "stale_gradients" and replier.counted_errors == []


def test_a_push_for_another_layout_is_a_layout_mismatch() -> None:
    g, _ = parts()
    g.weights.on_publish(peer("learner"), publish(0))
    other = push(0, 1)
    other.body["layout"] = "another"
    with pytest.raises(RequestError) as err:
        g.on_push_gradients(peer("worker"), other)
    assert err.value.reason == "layout_mismatch"


def test_a_barrier_round_is_applied_once_every_live_worker_pushed() -> None:
    registry = Registry(5.0)
    registry.join("w0", "actor")
    registry.join("w1", "actor")
    g, replier = parts(registry=registry)
    g.weights.on_publish(peer("learner"), publish(0))
    g.on_push_gradients(peer("w0"), push(0, 1, sender="w0/a", barrier=True))
    assert replier.types() == [(b"learner", "publish_ack")]
    g.on_push_gradients(peer("w1"), push(0, 1, sender="w1/a", barrier=True))
    assert replier.types()[1:] == [(b"w0", "gradients_ack"), (b"w1", "gradients_ack")]
    assert g.store.versions == [1, 0]


def test_the_checkpoint_restores_the_version(tmp_path: Path) -> None:
    path = str(tmp_path / "shard-0.npz")
    g, _ = parts(path)
    g.weights.on_publish(peer("learner"), publish(0, value=5))
    g.on_push_gradients(peer("worker"), push(0, 1))
    g.close()
    again, _ = parts(path)
    again.restore()
    assert again.store.versions == [1] and float(again.store.default.held[0].arrays["b"][0]) == 4.0
