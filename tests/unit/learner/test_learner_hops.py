"""The learner asks for no more than it needs.

- It learns the paramserver's current version with ``info`` (a few bytes per
  shard), never with ``get`` (the whole weights from every shard).
- Its version probe and its publishes share one client: a probe's reply that a
  publish reads first is kept for the probe, not dropped as late.
- In barrier mode a round asks replay for no ``info`` once a shard is known to
  be at its min size (the batches' ``table_size`` says so).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from common.clients.version_probe import VersionProbe
from common.clients.weights_publisher import WeightsPublisher
from common.metrics import ServiceMetrics
from common.wire.codec import Message
from common.wire.server import Peer
from common.wire.transport import free_tcp_port
from harness.paramserver_procs import serving
from services.paramserver.shard import ShardServer

WEIGHTS = {"w": np.ones((10, 10), np.float32), "b": np.zeros(10, np.float32)}


@contextmanager
def counted_shards(n: int) -> Iterator[tuple[list[str], Counter[str]]]:
    """``n`` shards in threads of this process, and a count of the message types they were sent."""
    seen: Counter[str] = Counter()
    with ExitStack() as stack:
        addresses = []
        for i in range(n):
            server = ShardServer(ServiceMetrics("paramserver", i), f"tcp://127.0.0.1:{free_tcp_port()}", i, n, 5.0,
                                 shm=False)
            for mtype, handler in list(server.handlers.items()):
                def counting(peer: Peer, msg: Message, handler: Any = handler) -> None:
                    seen[msg.type] += 1
                    handler(peer, msg)
                server.route(mtype, counting)
            stack.enter_context(serving(server))
            addresses.append(server.endpoint)
        yield addresses, seen


def learner_like(probe: VersionProbe, version: int = 0) -> Any:
    network = SimpleNamespace(timeout_s=5.0, paramserver=["(test)"])
    return SimpleNamespace(probe=probe, version=version, cfg=SimpleNamespace(network=network))


def test_the_learner_learns_the_version_with_info_not_get() -> None:
    from services.learner.learner import LearnerService

    with counted_shards(2) as (addresses, seen):
        publisher = WeightsPublisher(addresses, shm=False)
        try:
            probe = VersionProbe(publisher.shards)
            assert probe.newest(5.0) == [-1, -1]
            assert LearnerService.first_version(learner_like(probe, version=2)) == 2  # nothing held: its own
            publisher.publish(7, WEIGHTS, timeout_s=10)
            assert probe.newest(5.0) == [7, 7]
            assert LearnerService.first_version(learner_like(probe, version=2)) == 8
            assert seen["get"] == 0 and seen["wait"] == 0
            assert seen["info"] == 8  # four lookups, two shards
        finally:
            publisher.close()


def test_a_probe_reply_read_by_a_publish_is_kept_for_the_probe() -> None:
    with counted_shards(2) as (addresses, _):
        publisher = WeightsPublisher(addresses, shm=False)
        try:
            probe = VersionProbe(publisher.shards, every_s=0.0, timeout_s=5.0)
            publisher.publish(1, WEIGHTS, timeout_s=10)
            # info sent to both shards, still in flight (a step that finds both replies already there has
            # nothing to lose to a publish: ask again)
            for _ in range(50):
                if probe.step(1)[0] == "waiting":
                    break
            else:
                pytest.fail("the shards always answered info within the step that sent it")
            publisher.publish(2, WEIGHTS, timeout_s=10)  # its wait reads the info replies first
            deadline = time.monotonic() + 5
            while (step := probe.step(2))[0] == "waiting":
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert step[:2] == ("answered", [1, 1])  # sent before the publish of 2: answered with 1
        finally:
            publisher.close()


class NoInfoSampler:
    def __init__(self, sizes: list[int]) -> None:
        self.shards = [SimpleNamespace(size=n) for n in sizes]
        self.asked: list[int] = []

    def info(self, shard: int, timeout_s: float) -> dict[str, Any]:
        self.asked.append(shard)
        return {"tables": {"main": {"size": 0}}}


@pytest.mark.parametrize(("sizes", "ready", "asked"), [
    ([0, 50], True, []),  # a batch said shard 1 holds 50 >= min_size: nobody is asked
    ([0, 0], False, [0, 1]),  # start-up (or sizes forgotten after a round with no batch): ask each shard
])
def test_a_barrier_round_asks_replay_for_info_only_while_no_size_is_known(
    sizes: list[int], ready: bool, asked: list[int]
) -> None:
    from services.learner.training import Trainer

    sampler = NoInfoSampler(sizes)
    me = SimpleNamespace(sampler=sampler, table=SimpleNamespace(name="main", min_size=10),
                         cfg=SimpleNamespace(network=SimpleNamespace(replay=["a", "b"], timeout_s=1.0)))
    assert Trainer.replay_ready(me) is ready  # type: ignore[arg-type]
    assert sampler.asked == asked
