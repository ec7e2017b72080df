"""An env that emits a NaN observation or an Inf reward now and then no longer kills its actor (issue 42).

Replay refuses such an insert (``bad_value``: common/algorithms/values.py). That used to be fatal to the
actor like any refusal; it is a refusal of that insert's data alone, so the actor drops it, counts its
rows (``rlfleet_actor_transitions_refused_total``), logs it at most every 30 s and keeps acting. A real
actor, replay and paramserver over TCP; the env is ``harness.toy_envs:NaNCorridor``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from harness.fleet_helpers import CONFIGS
from harness.service_threads import replay_and_paramserver
from rlfleet.common import config as config_mod
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.actor.actor import ActorService

CARTPOLE = str(CONFIGS / "cartpole-dqn.yaml")


def test_an_actor_drops_what_replay_refuses_for_its_values_and_goes_on(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    replay_at, params_at = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    cfg = config_mod.load(CARTPOLE, environ={}, sets=[
        f"run_dir={tmp_path}", f"network.replay=[{replay_at}]", f"network.paramserver=[{params_at}]",
        "evaluator.enabled=false", "actor.insert_batch=8", "replay.tables.0.samples_per_insert=null",
        "env.id=harness.toy_envs:NaNCorridor", "env.kwargs={nan_every: 37, inf_reward_every: 53}",
    ])
    with replay_and_paramserver(cfg) as (replay, _):
        actor = ActorService(cfg, "actor-0")
        publisher = WeightsPublisher(cfg.network.paramserver)
        publisher.publish(0, actor.policy.net.state_dict())
        publisher.close()
        caplog.set_level(logging.WARNING, logger="rlfleet.common.clients.replay_insert")
        acting = threading.Thread(target=actor.run, daemon=True)
        acting.start()
        client = actor.replay
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (client.inserts_refused < 3 or client.items_acked < 200):
            assert acting.is_alive(), "the actor stopped"
            time.sleep(0.05)
        assert client.inserts_refused >= 3 and client.items_acked >= 200, (client.inserts_refused, client.items_acked)
        acked, deadline = client.items_acked, time.monotonic() + 30
        while client.items_acked <= acked and time.monotonic() < deadline:  # polled: no pace assumed
            time.sleep(0.05)
        assert acting.is_alive() and client.items_acked > acked, "the actor went on acting and inserting"
        actor.stop()
        acting.join(10)
        assert not acting.is_alive()
        actor.close()  # sends what is pending and waits for its acks
        sent = actor.metrics.registry.get_sample_value("rlfleet_actor_transitions_sent_total",
                                                       {"service": "actor", "shard": "0"})
        refused = actor.metrics.registry.get_sample_value("rlfleet_actor_transitions_refused_total",
                                                          {"service": "actor", "shard": "0"})
        assert refused == client.items_refused > 0
        # every row handed to the client was stored once or refused, nothing else: the table holds the acked ones
        assert client.items_acked + client.items_refused == sent, (client.items_acked, client.items_refused, sent)
        assert replay.server.tables["main"].size == client.items_acked
        lines = [r for r in caplog.records if "refused" in r.getMessage() and "bad_value" in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in lines]  # at most one line per 30 s
