"""RegistryRequests with a recording replier: hello, heartbeat and goodbye answered with welcome."""

from __future__ import annotations

import pytest

from harness.paramserver_fakes import RecordingReplier, peer, request
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.errors import RequestError
from rlfleet.services.paramserver.registry import Registry
from rlfleet.services.paramserver.registry_requests import RegistryRequests


def parts() -> tuple[RegistryRequests, Registry, RecordingReplier, ServiceMetrics]:
    m = ServiceMetrics("paramserver")
    replier, registry = RecordingReplier(), Registry(5.0)
    return RegistryRequests(replier, registry, m.gauge("paramserver_live_actors", "live")), registry, replier, m


def live_actors(m: ServiceMetrics) -> float | None:
    return m.registry.get_sample_value("rlfleet_paramserver_live_actors", {"service": "paramserver", "shard": "0"})


def test_hello_heartbeat_goodbye() -> None:
    r, registry, replier, m = parts()
    r.on_hello(peer("a"), request("hello", "a", actor_id="actor-0", role="actor"))
    r.on_hello(peer("b"), request("hello", "b", actor_id="actor-1", role="actor"))
    r.on_heartbeat(peer("a"), request("heartbeat", "a", actor_id="actor-0", role="actor", version=3, env_steps=50))
    assert [body["index"] for _, _, body, _ in replier.sent] == [0, 1, 0]
    assert replier.sent[-1][2]["fleet_env_steps"] == 50 and live_actors(m) == 2
    r.on_goodbye(peer("a"), request("goodbye", "a", actor_id="actor-0"))
    assert replier.sent[-1][1:3] == ("welcome", {"index": -1, "num_actors": 1, "liveness_ms": 5000,
                                                 "fleet_env_steps": 50})
    assert list(registry.members) == ["actor-1"] and live_actors(m) == 1


def test_a_bad_role_is_refused_with_its_reason() -> None:
    r, _, _, _ = parts()
    with pytest.raises(RequestError) as err:
        r.on_hello(peer("a"), request("hello", "a", actor_id="x", role="learner"))
    assert err.value.reason == "bad_role"


def test_tick_expires_the_silent_and_updates_the_gauge() -> None:
    now = [0.0]
    m = ServiceMetrics("paramserver")
    registry = Registry(5.0, clock=lambda: now[0])
    r = RegistryRequests(RecordingReplier(), registry, m.gauge("paramserver_live_actors", "live"))
    r.on_hello(peer("a"), request("hello", "a", actor_id="actor-0", role="actor"))
    now[0] = 10.0
    r.tick()
    assert registry.num_actors == 0 and live_actors(m) == 0
