"""A config or fleet that cannot run fails at start-up with a message that names the problem."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.fleet_helpers import CONFIGS, rlfleet
from harness.service_threads import replay_and_paramserver
from rlfleet.common import config as config_mod
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.envs import EnvError, make_vector_env, probe_env
from rlfleet.common.runtime import FatalError
from rlfleet.services.actor.actor import ActorService

CARTPOLE = str(CONFIGS / "cartpole-dqn.yaml")


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("env.id=NoSuchEnv-v0", ["env.id='NoSuchEnv-v0'", "doesn't exist"]),
        ("env.id=Pendulum-v1", ["dqn needs a Discrete action space", "Pendulum-v1", "Box"]),
        ("env.id=nosuchmodule:Env", ["cannot import module 'nosuchmodule'"]),
        ("replay.tables.0.kind=queue", ["kind='queue'", "uniform, prioritized"]),
    ],
)
def test_up_refuses_before_starting_anything(override: str, words: list[str], tmp_path: Path) -> None:
    proc = rlfleet("up", "--config", CARTPOLE, "--set", override, "--max-seconds", "5", "--runs", str(tmp_path),
                   timeout=120)
    assert proc.returncode == 2, proc.stdout
    for word in words:
        assert word in proc.stdout, (word, proc.stdout)
    assert not any(tmp_path.iterdir()), "no run directory: nothing was started"


def test_a_service_whose_peer_is_unreachable_says_which(tmp_path: Path) -> None:
    proc = rlfleet("service", "actor", "--config", CARTPOLE, "--set", "network.paramserver=[tcp://127.0.0.1:9]",
                   "--set", "network.timeout_s=1", "--set", f"run_dir={tmp_path}", timeout=120)
    assert proc.returncode == 1, proc.stdout
    assert "paramserver at tcp://127.0.0.1:9 did not answer" in proc.stdout
    assert "Traceback" not in proc.stdout


def test_custom_env_by_module_and_class() -> None:
    cfg = config_mod.load(CARTPOLE, sets=["env.id=harness.toy_envs:Corridor", "env.kwargs={length: 3}"], environ={})
    obs_space, act_space = probe_env(cfg)
    assert obs_space.shape == (2,) and act_space.n == 2
    envs = make_vector_env(cfg.env, seed=0)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (cfg.env.num_envs, 2)
    envs.close()
    bad = config_mod.load(CARTPOLE, sets=["env.id=harness.toy_envs:Nothing"], environ={})
    with pytest.raises(EnvError):
        probe_env(bad)


def test_an_actor_whose_transitions_replay_refuses_stops_with_the_field(tmp_path: Path) -> None:
    """Replay already holds another env's transitions (obs of 8 floats): CartPole's 4 are refused."""
    cfg = config_mod.load(CARTPOLE, environ={}, sets=[
        f"run_dir={tmp_path}", "network.replay=[inproc://schema-replay]",
        "network.paramserver=[inproc://schema-params]", "evaluator.enabled=false", "actor.insert_batch=8",
        "replay.tables.0.columns=first_insert",  # else replay refuses the other env's transitions itself
    ])
    with replay_and_paramserver(cfg):
        other = {"obs": np.zeros((8, 8), np.float32), "action": np.zeros(8, np.int64),
                 "reward": np.zeros(8, np.float32), "next_obs": np.zeros((8, 8), np.float32),
                 "discount": np.ones(8, np.float32)}
        with InsertClient(cfg.network.replay[0], "lunar-actor") as writer:
            writer.insert("main", other, np.ones(8))
            writer.flush(10)
        actor = ActorService(cfg, "actor-0")
        publisher = WeightsPublisher(cfg.network.paramserver)
        publisher.publish(0, actor.policy.net.state_dict())
        publisher.close()
        with pytest.raises(FatalError) as info:
            actor.run()
        assert "schema_mismatch" in str(info.value) and "'obs'" in str(info.value)
        actor.close()
