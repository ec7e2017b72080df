"""Registry indices, heartbeat expiry, and the round barrier with an actor killed mid-round."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import numpy as np
import pytest

from harness.paramserver_procs import ShardProcesses, serving
from rlfleet.common.clients.registry import RegistryClient
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.paramserver.barrier import MAX_PARKED_BARRIERS
from rlfleet.services.paramserver.registry import Registry
from rlfleet.services.paramserver.shard import ShardServer

LIVENESS_S = 1.0


def members(address: str) -> dict[str, int]:
    with Connection(address, "probe") as c:
        stats = c.request(Message("info"), 5.0)["stats"]
    return {actor_id: index for actor_id, _role, index in stats["actors"]}


def wait_until(cond, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_indices_stable_reused_and_expired() -> None:
    with ShardProcesses(2, liveness_s=LIVENESS_S) as ps:
        addr = ps.addresses[0]
        a, b, c = (RegistryClient(addr, n) for n in ("a", "b", "c"))
        ev = RegistryClient(addr, "eval", role="evaluator")
        assert [x.hello().index for x in (a, b, c)] == [0, 1, 2]
        w = ev.hello()
        assert (w.index, w.num_actors) == (-1, 3)  # evaluators do not count
        assert a.hello().index == 0 and a.heartbeat(5).index == 0  # stable
        assert b.goodbye().index == -1
        d = RegistryClient(addr, "d")
        assert d.hello().index == 1  # lowest free index is reused
        # c and the evaluator fall silent; a and d keep beating.
        stop = threading.Event()

        def beat() -> None:
            while not stop.is_set():
                a.heartbeat(1)
                d.heartbeat(1)
                time.sleep(0.2)

        t = threading.Thread(target=beat)
        t.start()
        try:
            wait_until(lambda: set(members(addr)) == {"a", "d"})
            w = c.heartbeat(3)  # an expired actor's heartbeat registers it again
            assert (w.index, w.num_actors) == (2, 3)
            assert members(addr) == {"a": 0, "d": 1, "c": 2}
        finally:
            stop.set()
            t.join()
        with pytest.raises(Exception, match="bad_role"):
            RegistryClient(addr, "x", role="learner").hello()
        for x in (a, b, c, d, ev):
            x.close()


def actor(addresses: list[str], actor_id: str) -> None:
    """A barrier-mode actor: heartbeats, then long-polls shard 0 for the next version forever."""
    reg = RegistryClient(addresses[0], actor_id)
    reg.hello()
    held = [-1]

    def beat() -> None:
        while True:
            reg.heartbeat(held[0])
            time.sleep(0.2)

    threading.Thread(target=beat, daemon=True).start()
    reader = WeightsReader(addresses, actor_id)
    while True:
        got = reader.wait(held[0] + 1, 2.0)
        if got is not None:
            held[0] = got[0]


def test_barrier_survives_an_actor_killed_mid_round() -> None:
    with ShardProcesses(2, liveness_s=LIVENESS_S) as ps:
        pub = WeightsPublisher(ps.addresses)
        with pytest.raises(CommTimeout):
            pub.barrier(0, 0.3)  # no live actor: the barrier waits, then times out
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=actor, args=(ps.addresses, f"actor-{i}"), daemon=True) for i in range(4)]
        for p in procs:
            p.start()
        try:
            wait_until(lambda: len(members(ps.addresses[0])) == 4, 30)
            weights = {"w": np.zeros((64, 64), np.float32), "b": np.zeros(64, np.float32)}
            pub.publish(0, weights)
            assert pub.barrier(0, 20.0) == 4  # every actor holds 0 and waits for 1
            procs[3].kill()  # dies mid-round
            procs[3].join(5)
            pub.publish(1, weights)
            assert pub.barrier(1, 20.0) == 3  # released once the dead actor's liveness ran out
            assert "actor-3" not in members(ps.addresses[0])
            pub.publish(2, weights)
            assert pub.barrier(2, 20.0) == 3
        finally:
            for p in procs:
                p.kill()
                p.join(5)
            pub.close()


def test_fleet_env_steps_adds_up_restarts() -> None:
    reg = Registry(5.0, clock=lambda: 0.0)
    assert reg.fleet_env_steps == 0
    reg.report_steps("a", 100)
    reg.report_steps("b", 50)
    reg.report_steps("a", 300)  # a's own total grew
    assert reg.fleet_env_steps == 350
    reg.report_steps("a", 20)  # a restarted from 0: its 300 stay counted
    assert reg.fleet_env_steps == 370
    reg.report_steps("a", 70)
    reg.report_steps("a", 5)  # and restarted again
    assert reg.fleet_env_steps == 300 + 70 + 5 + 50
    reg.join("b", "actor")
    reg.leave("b")  # leaving does not take b's steps away
    assert reg.fleet_env_steps == 425


def protocol_errors(server: ShardServer, reason: str) -> float:
    value = server.metrics.registry.get_sample_value(
        "rlfleet_protocol_errors_total", {"service": "paramserver", "shard": "0", "reason": reason})
    return value or 0.0


def test_shard0_registry_and_barrier_edges() -> None:
    server = ShardServer(ServiceMetrics("paramserver", 0), f"tcp://127.0.0.1:{free_tcp_port()}", 0, 1, 30.0,
                         shm=False)
    with serving(server):
        addr = server.endpoint
        pub = WeightsPublisher([addr])
        # Heartbeats carry env steps; welcome carries the fleet total, restarts included.
        a = RegistryClient(addr, "a")
        assert a.hello().fleet_env_steps == 0
        assert a.heartbeat(-1, env_steps=400).fleet_env_steps == 400
        assert a.heartbeat(-1, env_steps=30).fleet_env_steps == 430  # a restarted
        with Connection(addr, "z") as c:
            for actor_id in ("", "x" * 300):
                with pytest.raises(RemoteError, match="bad_actor_id"):
                    c.request(Message("hello", {"actor_id": actor_id, "role": "actor"}), 5.0)
        with pytest.raises(RemoteError, match="bad_role"):
            RegistryClient(addr, "y", role="learner").heartbeat(env_steps=5)
        assert a.heartbeat(-1).fleet_env_steps == 430  # a refused heartbeat reports no steps
        # A barrier that times out (the learner polls with short timeouts) is not a protocol error.
        with pytest.raises(CommTimeout, match="0 of 1 live actors"):
            pub.barrier(0, 0.2)
        assert protocol_errors(server, "timeout") == 0
        assert protocol_errors(server, "bad_actor_id") == 2  # refusals still count
        # The barrier still releases once every live actor waits for the next version.
        pub.publish(0, {"w": np.zeros(8, np.float32)})
        reader = WeightsReader([addr], "a", shm=False)
        result: dict[str, object] = {}
        t = threading.Thread(target=lambda: result.update(got=reader.wait(1, 30.0)))
        t.start()
        assert pub.barrier(0, 20.0) == 1
        pub.publish(1, {"w": np.ones(8, np.float32)})
        t.join(20)
        assert result["got"][0] == 1  # type: ignore[index]
        # At most MAX_PARKED_BARRIERS barriers wait at once; the next one is refused with busy.
        with Connection(addr, "learner") as c:
            seqs = [c.send(Message("barrier", {"round": 5, "timeout_ms": 60_000}))
                    for _ in range(MAX_PARKED_BARRIERS + 1)]
            reply = c.recv(10.0)
        assert (reply.type, reply["ref_seq"], reply["reason"]) == ("error", seqs[-1], "busy")
        assert protocol_errors(server, "busy") == 0
        reader.close()
        a.close()
        pub.close()
