"""Shard 0's registry holds at most paramserver.max_members members (issue 42 follow-up), real sockets.

A flood of ``hello``s under new actor ids used to grow the registry until its members expired, each join
scanning every member for the lowest free index. Now a ``hello`` beyond the cap is refused with
``too_many_members``, naming the limit, and indices come from a heap of free ones.
"""

from __future__ import annotations

import zmq

from harness.paramserver_procs import serving
from rlfleet.common.clients.registry import RegistryClient
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.transport import free_tcp_port, make_socket
from rlfleet.services.paramserver.shard import ShardServer

CAP = 300


def test_a_flood_of_hellos_stops_at_max_members_and_indices_stay_the_lowest_free() -> None:
    server = ShardServer(ServiceMetrics("paramserver", 0), f"tcp://127.0.0.1:{free_tcp_port()}", 0, 1, 30.0,
                         shm=False, max_members=CAP)
    with serving(server):
        addr = server.endpoint
        ev = RegistryClient(addr, "eval", role="evaluator")
        assert ev.hello().index == -1  # an evaluator is a member too
        flood = make_socket(zmq.DEALER, connect=addr)
        try:
            for i in range(CAP + 200):  # sent without waiting, as a flood would
                flood.send_multipart(encode(Message("hello", {"actor_id": f"flood-{i}", "role": "actor"},
                                                    sender="flood", seq=i)))
            indices, refused = [], []
            for _ in range(CAP + 200):
                assert flood.poll(30_000), "no reply"
                reply = decode(flood.recv_multipart())
                if reply.type == "welcome":
                    indices.append(reply["index"])
                else:
                    refused.append(reply)
        finally:
            flood.close(linger=0)
        assert indices == list(range(CAP - 1))  # the evaluator holds one of the CAP places
        assert len(refused) == 201
        assert {r["reason"] for r in refused} == {"too_many_members"}
        assert f"{CAP} live members (paramserver.max_members)" in refused[0]["detail"]
        assert server.registry is not None and len(server.registry.members) == CAP
        with Connection(addr, "probe") as c:
            assert c.request(Message("info"), 10.0)["stats"]["num_actors"] == CAP - 1
            # a member already registered still beats when the registry is full
            w = c.request(Message("heartbeat", {"actor_id": "flood-7", "role": "actor", "version": -1}), 10.0)
            assert w["index"] == 7 and w["num_actors"] == CAP - 1
            for gone in ("flood-3", "flood-1"):  # leave out of order: the lowest free index is still given
                c.request(Message("goodbye", {"actor_id": gone}), 10.0)
            got = [c.request(Message("hello", {"actor_id": f"late-{i}", "role": "actor"}), 10.0)["index"]
                   for i in range(2)]
            assert got == [1, 3]
            ev.goodbye()  # an evaluator leaving frees a place, not an index
            assert c.request(Message("hello", {"actor_id": "late-2", "role": "actor"}), 10.0)["index"] == CAP - 1
        ev.close()
