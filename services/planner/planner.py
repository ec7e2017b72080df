"""A planner: rolls the world model forward with the current policy and inserts what it imagines.

It is an actor whose env is the model (common/planning/imagined_env.py): start
states are real observations sampled from the learner's table (samples the
rate limiter neither holds nor counts, so the learner's budget is untouched),
actions come from the algorithm's policy exploring as the first actor does at
the end of its schedule, and the algorithm's adder turns the steps into items
of the real table's columns, inserted into ``planning.table``. Nothing is made
while the gate is closed (no model yet, or its validation error at or above
``planning.gate``). Planners do not register: they are not actors, their steps
are no env steps, and a barrier never waits for them.

Weights (policy and model) are polled every ``planning.poll_every`` rollout
batches; the start-state pool is refreshed then too.
"""

from __future__ import annotations

import logging
import secrets
import time
import zlib
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlfleet.common import algorithms
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.config import Experiment
from rlfleet.common.envs import acting_policy, probe_env
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.planning.dynamics import ModelMismatch, model_spaces
from rlfleet.common.planning.imagined_env import ImaginedEnv
from rlfleet.common.planning.model_watch import ModelWatch
from rlfleet.common.runtime import StartupError, refusal_is_fatal
from rlfleet.common.security import client_curve
from rlfleet.common.wire.errors import CommTimeout, RemoteError

log = logging.getLogger("rlfleet.planner")

FLEET_DONE = 1 << 62  # the fleet steps at which every exploration schedule has ended
GATE_WAIT_S = 0.5  # how often a planner with a closed gate asks for a newer model


class PlannerService:
    def __init__(self, cfg: Experiment, planner_id: str, index: int = 0) -> None:
        self.cfg = cfg
        self.planner_id = planner_id
        self._stopping = False
        torch.set_num_threads(cfg.actor.torch_threads)
        obs_space, act_space = probe_env(cfg)
        try:
            model_spaces(obs_space, act_space)
        except ModelMismatch as exc:
            raise StartupError(f"planning.enabled with env.id={cfg.env.id!r}: {exc}") from None
        assert isinstance(obs_space, gym.spaces.Box)  # model_spaces checked it
        self.algo = algorithms.get(cfg.algorithm.name)
        self.act_space = act_space
        curve = client_curve(cfg, "planner")
        # seeded by its id too: planners scaled by compose all have index 0 but ids of their own
        seed = [cfg.seed, index, zlib.crc32(planner_id.encode())]
        self.policy = acting_policy(cfg, act_seed=[*seed, 1])
        self.exploration = self.policy.explore(0, 1, FLEET_DONE)
        self.reader = WeightsReader(cfg.network.paramserver, planner_id, curve=curve, timeout_s=cfg.network.timeout_s)
        self.model = ModelWatch(cfg, planner_id, obs_space, act_space, curve=curve, every_s=0.0)
        p = cfg.planning
        shard = index % cfg.replay.shards
        self.sender = f"{planner_id}/{secrets.token_hex(16)}"
        self.replay = InsertClient.from_config(cfg, shard, self.sender, curve=curve)
        self.starts = SampleClient([cfg.network.replay[shard]], self.sender, cfg.learner.table, p.rollouts,
                                   in_flight=1, seed=seed[-1] ^ cfg.seed, curve=curve, rate_limited=False)
        self.rng = np.random.default_rng([*seed, 2])
        self.act_space.seed(int(self.rng.integers(1 << 31)))
        self.pool = np.zeros((0, *obs_space.shape), np.float32)
        self.env = ImaginedEnv(self.model.net, p.rollouts, p.rollout_length, self._start_states, obs_space,
                               self.algo.autoreset_mode)
        self.adder = self.algo.make_adder(cfg.algorithm, p.rollouts, obs_space, act_space, self.algo.autoreset_mode)
        self.version = -1
        self.metrics = ServiceMetrics("planner", index)
        m = self.metrics
        self.m_steps = m.counter("planner_imagined_steps", "Model steps taken (imagined env steps).")
        self.m_sent = m.counter("planner_imagined_inserts", "Imagined transitions inserted into planning.table.")
        self.m_refused = m.counter("planner_imagined_refused", "Imagined transitions replay refused for their values"
                                   " (bad_value: a NaN the model predicted, ...), dropped by the planner.")
        self._refused = 0
        self.m_gate = m.gauge("planner_gate_open", "1 while the world model is good enough to plan with.")
        self.m_val = m.gauge("planner_model_val_error", "Validation error of the world model planned with.")
        self.m_model = m.gauge("planner_model_version", "World model version planned with (-1: none).")
        self.m_version = m.gauge("weights_version", "Policy weights version this planner acts with.")
        self.m_model.set(-1)
        self.m_version.set(-1)
        log.info("planner %s: %d rollouts of %d model steps into table %r, replay shard %d, %s", planner_id,
                 p.rollouts, p.rollout_length, p.table, shard,
                 ", ".join(f"{k} {v:.4g}" for k, v in self.exploration.items()) or "no exploration parameter")

    # -- inputs -------------------------------------------------------------------
    def _start_states(self, n: int) -> np.ndarray:
        return self.pool[self.rng.integers(0, len(self.pool), n)]

    def _refresh_pool(self, timeout_s: float) -> bool:
        """Fresh real start states from the learner's table; False if none came (the old pool stays)."""
        try:
            batch = self.starts.sample(timeout_s=timeout_s)
        except (CommTimeout, RemoteError):
            return False
        self.pool = np.asarray(batch.data["obs"], np.float32)
        return len(self.pool) > 0

    def _poll_weights(self, timeout_s: float) -> None:
        try:
            got = self.reader.get(self.version, timeout_s=timeout_s)
        except (CommTimeout, RemoteError) as exc:
            log.debug("planner %s: weights poll failed: %s", self.planner_id, exc)
            return
        if got is not None:
            self.version, weights = got
            self.policy.load_weights(weights)
            self.m_version.set(self.version)

    def _poll_model(self) -> None:
        self.model.refresh(timeout_s=min(2.0, self.cfg.network.timeout_s), force=True)
        self.m_gate.set(float(self.model.open))
        self.m_val.set(self.model.val_error)
        self.m_model.set(self.model.version)

    def _ready(self) -> bool:
        """Wait (polling) until the gate is open and policy weights and start states are held."""
        while not self._stopping:
            self._poll_model()
            if self.model.open:
                if self.version < 0:
                    self._poll_weights(timeout_s=2.0)
                if self.version >= 0 and (len(self.pool) or self._refresh_pool(timeout_s=2.0)):
                    return True
            time.sleep(GATE_WAIT_S)
        return False

    # -- loop ---------------------------------------------------------------------
    def run(self) -> None:
        # replay refused an insert for a reason the next one would repeat (schema_mismatch, ...); one refused for
        # its values (bad_value) is dropped and counted by the client (planner_imagined_refused)
        with refusal_is_fatal(f"replay at {self.replay.address} refused imagined transitions"):
            self._run()

    def _run(self) -> None:
        table = self.cfg.planning.table
        while self._ready():
            obs, _ = self.env.reset()
            self.adder.reset(obs)
            for _ in range(self.cfg.planning.poll_every):
                if self._stopping:
                    break
                actions, extras = self.policy.act(obs)
                actions = self._explore(actions)
                before = self.env.steps
                obs, rewards, terminated, truncated, infos = self.env.step(actions)
                self.m_steps.inc(self.env.steps - before)
                items = self.adder.add(actions, extras, obs, rewards, terminated, truncated, infos, self.version)
                rows = len(items["version"]) if items else 0
                if rows:
                    self._insert(table, items, rows)
            self._poll_weights(timeout_s=min(2.0, self.cfg.network.timeout_s))
            self._refresh_pool(timeout_s=0.5)

    def _explore(self, actions: np.ndarray) -> np.ndarray:
        """``planning.random_actions`` of the slots take a uniformly random action instead."""
        share = self.cfg.planning.random_actions
        if share <= 0:
            return actions
        pick = self.rng.random(len(actions)) < share
        if pick.any():
            actions = np.array(actions, copy=True)
            actions[pick] = np.stack([self.act_space.sample() for _ in range(int(pick.sum()))]).astype(actions.dtype)
        return actions

    def _insert(self, table: str, items: dict[str, np.ndarray], rows: int) -> None:
        priorities = self.policy.priorities(items)
        while not self._stopping:
            try:
                self.replay.insert(table, items, priorities, timeout_s=self.cfg.actor.heartbeat_s)
                self.m_sent.inc(rows)
                if self.replay.items_refused > self._refused:  # dropped by the client, which goes on
                    self.m_refused.inc(self.replay.items_refused - self._refused)
                    self._refused = self.replay.items_refused
                return
            except CommTimeout:  # replay away, or its rate limiter holds our acks: wait, keep the window
                self.replay.poll()

    def stop(self) -> None:
        self._stopping = True

    def health(self) -> dict[str, Any]:
        return {"ok": not self._stopping, "planner_id": self.planner_id, "version": self.version,
                "model_version": self.model.version, "gate_open": self.model.open,
                "val_error": self.model.val_error, "imagined_steps": self.env.steps}

    def close(self) -> None:
        try:
            self.replay.flush(timeout_s=2.0)
        except (CommTimeout, RemoteError) as exc:
            log.warning("planner %s: %d inserts un-acked at stop: %s", self.planner_id, self.replay.unacked, exc)
        self.replay.close()
        self.starts.close()
        self.reader.close()
        self.model.close()
