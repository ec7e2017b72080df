"""A modeler that starts without a checkpoint takes the world model the paramserver holds.

Killed before its first checkpoint, or moved to a node whose volume never held it, a fresh modeler
would publish a random world model as the next version, over the one the fleet trained (its planners
then imagine with it until it has learnt again). It must instead go on from the paramserver's model,
after its version; with a checkpoint it keeps its own; with nothing published it starts fresh at 0.
Real replay and paramserver (threads of this process), the real ModelerService.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

from harness.service_threads import replay_and_paramserver
from rlfleet.common.algorithms.checkpoint import save_checkpoint
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.config import Experiment, load
from rlfleet.common.config.planning import PLANNING_MODEL
from rlfleet.common.planning.dynamics import VAL_ERROR, DynamicsLearner
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.modeler.modeler import CHECKPOINT, ModelerService

ROOT = Path(__file__).resolve().parents[3]


def config(run_dir: Path) -> Experiment:
    replay, params = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    return load(ROOT / "configs" / "cartpole-dynaq.yaml",
                [f"network.replay=[{replay}]", f"network.paramserver=[{params}]", f"run_dir={run_dir}",
                 "network.timeout_s=10"], environ={})


def trained(cfg: Experiment, seed: int) -> DynamicsLearner:
    """A world model unlike a fresh one: a few updates on random CartPole-shaped data."""
    env = gym.make(cfg.env.id)
    model = DynamicsLearner(cfg.planning.model, env.observation_space, env.action_space, device="cpu", seed=seed)
    rng = np.random.default_rng(seed)
    n = 512
    batch = {"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(0, 2, n),
             "reward": np.ones(n, np.float32), "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
             "discount": np.full(n, 0.99, np.float32)}
    for _ in range(20):
        model.learn(batch, np.arange(n))
    return model


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_modeler_without_checkpoint_goes_on_from_the_fleets_world_model(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    with replay_and_paramserver(cfg):
        fresh = ModelerService(cfg)  # nothing published: a fresh model at version 0
        try:
            assert fresh.version == 0
            untrained = fresh.core.weights()
        finally:
            fresh.close()
        (tmp_path / CHECKPOINT).unlink()  # as if it was killed (SIGKILL) before its first checkpoint
        fleets = trained(cfg, seed=5).weights()
        publisher = WeightsPublisher(cfg.network.paramserver, "modeler", model=PLANNING_MODEL)
        try:
            publisher.publish(7, fleets, timeout_s=10)
        finally:
            publisher.close()
        assert not same(untrained, fleets)

        restarted = ModelerService(cfg)  # no checkpoint: the paramserver's model, after its version
        try:
            assert restarted.version == 8
            assert same(restarted.core.weights(), fleets)
            assert restarted.core.val_error == float(fleets[VAL_ERROR])
        finally:
            restarted.close()

        own = trained(cfg, seed=9)  # with a checkpoint: its own model and version, whatever the fleet holds
        save_checkpoint(tmp_path / CHECKPOINT, {"core": own.state(), "version": 3})
        resumed = ModelerService(cfg)
        try:
            assert resumed.version == 4
            assert same(resumed.core.weights(), own.weights())
        finally:
            resumed.close()
