"""A learner that starts without the fleet's newest state takes the paramserver's newest weights.

A learner killed (SIGKILL) before its first checkpoint, or moved to a node whose volume never held
it, starts with none: it must publish the fleet's weights as its first version, not its fresh random
ones (issue 43: a LunarLander fleet lost its training that way). One whose checkpoint is older than
the paramserver's newest version takes the newer weights too and keeps its checkpoint's counters.
Real replay, paramserver and learner processes; the weights are compared array by array.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

from harness.fleet_helpers import wait_for
from harness.service_procs import CARTPOLE, ServiceProcess
from rlfleet.common import algorithms
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.config import load
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.learner.learner import checkpoint_path

Weights = dict[str, np.ndarray]


def transitions(n: int) -> dict[str, np.ndarray]:
    """CartPole DQN items acted with version 0."""
    rng = np.random.default_rng(0)
    return {"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(0, 2, n),
            "reward": np.ones(n, np.float32), "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
            "discount": np.full(n, 0.99, np.float32), "version": np.zeros(n, np.int64)}


def newest(paramserver: str) -> tuple[int, Weights]:
    reader = WeightsReader([paramserver], "test", timeout_s=10, shm=False)
    try:
        got = reader.get(-1)
    finally:
        reader.close()
    assert got is not None, "the paramserver holds no version"
    version, arrays = got
    return version, {k: np.array(v) for k, v in arrays.items()}


def seed_weights(seed: int, sets: list[str]) -> Weights:
    """What a fresh learner of the CartPole DQN config (with ``sets``) of ``seed`` publishes."""
    cfg = load(CARTPOLE, sets, environ={})
    env = gym.make(cfg.env.id)
    return algorithms.get(cfg.algorithm.name).make_learner(cfg.algorithm, env.observation_space, env.action_space,
                                                           device="cpu", seed=seed).weights()


def same(a: Weights, b: Weights) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def learner(run_dir: Path, sets: list[str]) -> ServiceProcess:
    return ServiceProcess("learner", run_dir, sets).wait_healthy(120)


def test_learner_killed_before_its_first_checkpoint_restarts_from_the_fleets_weights(tmp_path: Path) -> None:
    replay, params, nowhere = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(3))
    sets = [f"network.paramserver=[{params}]", "replay.tables.0.min_size=64", "replay.tables.0.samples_per_insert=null",
            "algorithm.batch_size=32", "learner.publish_every=5", "learner.checkpoint_every_s=3600"]
    procs = [ServiceProcess("replay", tmp_path, [*sets, f"network.replay=[{replay}]"]),
             ServiceProcess("paramserver", tmp_path, sets)]
    try:
        for p in procs:
            p.wait_healthy(60)
        first = learner(tmp_path, [*sets, f"network.replay=[{replay}]"])
        procs.append(first)
        with InsertClient(replay, "actor-x") as client:
            client.insert("main", transitions(256))
            client.flush(30)
        wait_for(lambda: first.metric("rlfleet_learner_version") >= 4, 120, "the learner to train and publish")
        first.proc.kill()  # SIGKILL: no checkpoint written on the way out
        first.proc.wait(10)
        assert not checkpoint_path_of(tmp_path).exists()
        held, trained = newest(params)
        assert held >= 4
        fresh = seed_weights(0, sets)
        assert not same(trained, fresh), "the fleet's weights must differ from a fresh learner's for the test to mean"
        with Connection(params, "actor-x") as conn:  # the registry counts the fleet's env steps from heartbeats
            body = {"actor_id": "actor-x", "role": "actor", "version": held, "env_steps": 12_345}
            assert conn.request(Message("heartbeat", body), 10).type == "welcome"

        # restarted with no checkpoint; its replay is away, so it publishes and cannot train on
        second = learner(tmp_path, [*sets, f"network.replay=[{nowhere}]"])
        procs.append(second)
        wait_for(lambda: newest(params)[0] > held, 60, "the restarted learner to publish")
        version, weights = newest(params)
        assert version == held + 1
        assert same(weights, trained), "the restarted learner published other weights than the fleet's newest"
        assert "starting from the fleet's weights" in second.log()
        assert "the fleet's env steps 12345" in second.log()  # what runs on env steps goes on from there
    finally:
        for p in reversed(procs):
            p.stop()


def test_learner_with_an_older_checkpoint_takes_the_newer_weights_and_keeps_its_counters(tmp_path: Path) -> None:
    params, nowhere = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    sets = [f"network.paramserver=[{params}]", f"network.replay=[{nowhere}]"]
    procs = [ServiceProcess("paramserver", tmp_path, sets)]
    try:
        procs[0].wait_healthy(60)
        first = learner(tmp_path, sets)
        procs.append(first)
        wait_for(lambda: newest(params)[0] >= 0, 60, "the learner's first version")
        assert first.stop() == 0  # SIGTERM: a checkpoint at its version
        assert checkpoint_path_of(tmp_path).exists()
        held, _ = newest(params)

        # the fleet went on without it (a learner elsewhere published further)
        newer = {k: v + 1.0 for k, v in seed_weights(7, sets).items()}
        publisher = WeightsPublisher([params], "elsewhere", shm=False)
        try:
            publisher.publish(held + 5, newer, timeout_s=10)
        finally:
            publisher.close()

        second = learner(tmp_path, sets)
        procs.append(second)
        wait_for(lambda: newest(params)[0] > held + 5, 60, "the restarted learner to publish")
        version, weights = newest(params)
        assert version == held + 6
        assert same(weights, newer), "a learner whose checkpoint is older published its own weights"
        assert "checkpoint at version" in second.log() and "is older" in second.log()
    finally:
        for p in reversed(procs):
            p.stop()


def checkpoint_path_of(run_dir: Path) -> Path:
    return checkpoint_path(load(CARTPOLE, [f"run_dir={run_dir}"], environ={}))
