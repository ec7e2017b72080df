"""RoundBarrier alone (a real Registry on a fake clock, real LongPolls, a recording replier): the
barrier of round k answers once every live actor waits for version k + 1."""

from __future__ import annotations

import time

from harness.paramserver_fakes import RecordingReplier, metrics, peer, request
from rlfleet.common.wire.schema import DEFAULT_MODEL
from rlfleet.services.paramserver.barrier import MAX_PARKED_BARRIERS, RoundBarrier
from rlfleet.services.paramserver.long_polls import LongPolls
from rlfleet.services.paramserver.registry import Registry


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def parts() -> tuple[RoundBarrier, Registry, LongPolls, RecordingReplier, Clock]:
    clock, replier, m = Clock(), RecordingReplier(), metrics()
    registry = Registry(5.0, clock=clock)
    polls = LongPolls(m.waits_parked)
    return RoundBarrier(replier, registry, polls, m.barrier_wait), registry, polls, replier, clock


def ask(barrier: RoundBarrier, round_: int, timeout_ms: int = 60_000) -> None:
    barrier.on_barrier(peer("learner", round_ + 1), request("barrier", "learner", round=round_, timeout_ms=timeout_ms))


def test_it_answers_once_every_live_actor_waits_for_the_next_version() -> None:
    barrier, registry, polls, replier, _ = parts()
    registry.join("actor-0", "actor")
    registry.join("actor-1", "actor")
    registry.join("eval-0", "evaluator")  # evaluators never count
    ask(barrier, 3)
    polls.park(peer("actor-0"), 4, 60_000, False, DEFAULT_MODEL)
    barrier.tick(time.monotonic())
    assert replier.sent == [] and len(barrier) == 1
    polls.park(peer("actor-1"), 4, 60_000, False, DEFAULT_MODEL)
    barrier.tick(time.monotonic())
    assert replier.sent == [(b"learner", "barrier_reply", {"round": 3, "actors": 2}, True)]
    assert len(barrier) == 0


def test_with_no_live_actor_it_waits_until_its_timeout() -> None:
    barrier, _, _, replier, _ = parts()
    ask(barrier, 0, timeout_ms=0)
    barrier.tick(time.monotonic() + 0.001)
    [(_, mtype, body, _)] = replier.sent
    assert (mtype, body["reason"]) == ("error", "timeout") and "0 of 0 live actors" in body["detail"]
    assert replier.counted_errors == []  # the learner polls with short timeouts: not a protocol error


def test_an_expired_actor_stops_counting() -> None:
    barrier, registry, polls, replier, clock = parts()
    registry.join("actor-0", "actor")
    registry.join("actor-dead", "actor")
    ask(barrier, 0)
    polls.park(peer("actor-0"), 1, 60_000, False, DEFAULT_MODEL)
    barrier.tick(time.monotonic())
    assert replier.sent == []
    clock.now = 6.0
    registry.touch("actor-0")
    assert [m.actor_id for m in registry.expire()] == ["actor-dead"]
    barrier.tick(time.monotonic())
    assert [t for _, t, _, _ in replier.sent] == ["barrier_reply"]


def test_a_wait_for_another_model_does_not_count() -> None:
    barrier, registry, polls, replier, _ = parts()
    registry.join("actor-0", "actor")
    ask(barrier, 0)
    polls.park(peer("actor-0"), 1, 60_000, False, "dynamics")
    barrier.tick(time.monotonic())
    assert replier.sent == []


def test_too_many_parked_barriers_are_busy() -> None:
    barrier, _, _, replier, _ = parts()
    for k in range(MAX_PARKED_BARRIERS + 1):
        ask(barrier, k)
    [(_, mtype, body, _)] = replier.sent
    assert (mtype, body["reason"]) == ("error", "busy") and len(barrier) == MAX_PARKED_BARRIERS
