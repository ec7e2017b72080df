"""The learner asks for no more than it needs. The learner's real objects (LearnerService, Trainer)
against real servers in threads of this process.

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
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.fleet_helpers import CONFIGS
from harness.paramserver_procs import serving
from harness.replay_helpers import ask, transitions
from harness.service_threads import replay_and_paramserver
from rlfleet.common import config as config_mod
from rlfleet.common.clients.version_probe import VersionProbe
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.config import Experiment
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.server import Peer
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.learner.learner import LearnerService
from rlfleet.services.paramserver.shard import ShardServer

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


def learner_config(tmp_path: Path, paramserver: list[str], *sets: str) -> Experiment:
    """cartpole-dqn with its run dir in ``tmp_path``, on ``paramserver``'s shards and a replay of its own."""
    return config_mod.load(str(CONFIGS / "cartpole-dqn.yaml"), environ={}, sets=[
        f"run_dir={tmp_path}", f"network.replay=[tcp://127.0.0.1:{free_tcp_port()}]",
        f"network.paramserver=[{','.join(paramserver)}]", f"paramserver.shards={len(paramserver)}",
        "evaluator.enabled=false", *sets])


def test_the_learner_learns_the_version_with_info_not_get(tmp_path: Path) -> None:
    with counted_shards(2) as (addresses, seen):
        learner = LearnerService(learner_config(tmp_path, addresses))
        publisher = WeightsPublisher(addresses, shm=False)
        try:
            asked = Counter(seen)
            assert learner.first_version() == 0  # nothing held: its own
            publisher.publish(7, WEIGHTS, timeout_s=10)
            learner.version = 2
            assert learner.first_version() == 8  # after the paramserver's newest
            learner.version = 9
            assert learner.first_version() == 9  # its own, newer
            assert seen["get"] == asked["get"] and seen["wait"] == asked["wait"] == 0
            assert seen["info"] - asked["info"] == 6  # three lookups, two shards
        finally:
            publisher.close()
            learner.trainer.close()
            learner.publisher.close()


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


def received(replay: Any, mtype: str) -> int:
    value = replay.metrics.registry.get_sample_value(
        "rlfleet_messages_total", {"service": "replay", "shard": "0", "type": mtype, "direction": "in"})
    return int(value or 0)


def infos_asked_by(replay: Any, act: Callable[[], Any]) -> tuple[Any, int]:
    """What ``act`` returns, and how many ``info`` requests replay received meanwhile. Replay adds its counts
    after each burst: a request sent after ``act`` that it cannot decode (``priorities`` without its arrays),
    once counted, says that every ``info`` ``act`` sent is counted too."""
    infos, markers = received(replay, "info"), received(replay, "undecodable")
    result = act()
    ask(replay.server.endpoint, Message("priorities", {"table": "(marker)"}), "marker", 1)
    deadline = time.monotonic() + 30
    while received(replay, "undecodable") == markers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert received(replay, "undecodable") == markers + 1
    return result, received(replay, "info") - infos


def dqn_transitions(n: int) -> dict[str, np.ndarray]:
    """The columns a CartPole DQN actor inserts (replay refuses others), acted with version 0."""
    data = transitions(0, 0, n)
    return {"obs": data["obs"], "action": data["action"], "reward": data["reward"], "next_obs": data["next_obs"],
            "discount": np.full(n, 0.99, np.float32), "version": np.zeros(n, np.int64)}


def test_a_barrier_round_asks_replay_for_info_only_while_no_size_is_known(tmp_path: Path) -> None:
    cfg = learner_config(tmp_path, [f"tcp://127.0.0.1:{free_tcp_port()}"], "replay.tables.0.min_size=64",
                         "replay.tables.0.samples_per_insert=null")
    with replay_and_paramserver(cfg) as (replay, _):
        learner = LearnerService(cfg)
        trainer = learner.trainer
        try:
            # start-up: no size known, replay below its min size: each shard is asked, not ready
            assert infos_asked_by(replay, trainer.replay_ready) == (False, 1)
            assert ask(replay.server.endpoint, Message("insert", {"table": "main"}, dqn_transitions(64)),
                       "filler", 1)["stored"] == 64
            # still no size known (no batch yet): asked again, and now ready
            assert infos_asked_by(replay, trainer.replay_ready) == (True, 1)
            batch = trainer.take_batch(timeout_s=30)
            assert batch is not None and batch.table_size == 64
            # a batch said the shard holds 64 >= min_size: nobody is asked
            assert infos_asked_by(replay, trainer.replay_ready) == (True, 0)
            trainer.sampler.forget_sizes()  # as after a round with no batch (replay restarted?): asked again
            assert infos_asked_by(replay, trainer.replay_ready) == (True, 1)
        finally:
            trainer.close()
            learner.publisher.close()
