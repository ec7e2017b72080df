"""WeightsRequests with a recording replier: publish, get and wait answered, parked and woken."""

from __future__ import annotations

import time

import pytest

from harness.paramserver_fakes import RecordingReplier, metrics, peer, publish, request
from rlfleet.common.wire.errors import RequestError
from rlfleet.services.paramserver.long_polls import LongPolls
from rlfleet.services.paramserver.registry import Registry
from rlfleet.services.paramserver.shm_versions import ShmVersions
from rlfleet.services.paramserver.weights_requests import WeightsRequests
from rlfleet.services.paramserver.weights_store import WeightsStore


def parts(registry: Registry | None = None) -> tuple[WeightsRequests, RecordingReplier]:
    replier = RecordingReplier()
    m = metrics()
    shm = ShmVersions(replier.name, 0, enabled=False)
    return WeightsRequests(replier, WeightsStore(0, 1), LongPolls(m.waits_parked), shm, registry, m), replier


def test_get_answers_not_modified_until_a_newer_version_is_stored() -> None:
    w, replier = parts()
    w.on_get(peer("r"), request("get", "r", have_version=-1))
    w.on_publish(peer("learner"), publish(1))
    w.on_get(peer("r"), request("get", "r", have_version=-1))
    w.on_get(peer("r"), request("get", "r", have_version=1))
    assert [t for _, t, _, _ in replier.sent] == ["not_modified", "publish_ack", "weights", "not_modified"]
    _, _, body, copy = replier.sent[2]
    assert body["version"] == 1 and body["versions"] == [1]
    assert copy  # arrays built here, not received frames: copied into the message


def test_a_parked_wait_is_woken_by_the_publish_before_its_ack() -> None:
    w, replier = parts()
    w.on_wait(peer("r"), request("wait", "r", min_version=2, timeout_ms=60_000))
    w.on_publish(peer("learner"), publish(1))
    assert len(w.long_polls) == 1
    w.on_publish(peer("learner"), publish(2))
    assert replier.types() == [(b"learner", "publish_ack"), (b"r", "weights"), (b"learner", "publish_ack")]
    assert len(w.long_polls) == 0 and w.store.versions == [2, 1]


def test_asking_again_ends_the_earlier_poll_and_the_deadline_ends_the_last() -> None:
    w, replier = parts()
    w.on_wait(peer("r", 1), request("wait", "r", min_version=5, timeout_ms=0))
    w.on_wait(peer("r", 2), request("wait", "r", min_version=5, timeout_ms=0))
    assert replier.types() == [(b"r", "not_modified")] and len(w.long_polls) == 1
    w.tick(time.monotonic() + 1)
    assert replier.types() == [(b"r", "not_modified")] * 2 and len(w.long_polls) == 0


def test_get_of_a_version_no_longer_held_is_version_gone_not_a_protocol_error() -> None:
    w, replier = parts()
    for v in (1, 2, 3):
        w.on_publish(peer("learner"), publish(v))
    w.on_get(peer("r"), request("get", "r", have_version=-1, version=1))
    w.on_get(peer("r"), request("get", "r", have_version=-1, version=2))
    _, mtype, body, _ = replier.sent[-2]
    assert (mtype, body["reason"]) == ("error", "version_gone") and replier.counted_errors == []
    _, mtype, body, _ = replier.sent[-1]
    assert (mtype, body["version"], body["versions"]) == ("weights", 2, [3, 2])


def test_a_retried_publish_is_acked_again_and_a_stale_one_refused() -> None:
    w, replier = parts()
    w.on_publish(peer("learner"), publish(1))
    w.on_publish(peer("learner"), publish(1))
    assert replier.types() == [(b"learner", "publish_ack")] * 2 and w.store.versions == [1]
    with pytest.raises(RequestError) as err:
        w.on_publish(peer("learner"), publish(1, value=5))
    assert err.value.reason == "stale_version"


def test_named_models_wake_their_own_waits_only() -> None:
    w, replier = parts()
    w.on_wait(peer("planner"), request("wait", "planner", min_version=1, timeout_ms=60_000, model="dynamics"))
    w.on_publish(peer("learner"), publish(1))
    assert len(w.long_polls) == 1
    w.on_publish(peer("learner"), publish(1, model="dynamics"))
    assert (b"planner", "weights") in replier.types() and len(w.long_polls) == 0


def test_gets_and_waits_are_signs_of_life_for_the_registry() -> None:
    now = [0.0]
    registry = Registry(5.0, clock=lambda: now[0])
    registry.join("actor-0", "actor")
    w, _ = parts(registry)
    now[0] = 4.0
    w.on_get(peer("actor-0"), request("get", "actor-0", have_version=-1))
    now[0] = 8.0
    assert registry.expire() == []
