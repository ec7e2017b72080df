"""The actor: steps a vector env with the current policy and streams transitions to replay.

Async protocol: it never waits for the learner; it polls the paramserver every
``actor.poll_every`` vector steps. Barrier protocol: round k is
``actor.steps_per_round`` vector steps on version k; then the actor flushes its
inserts (every one acked) and long-polls for version k + 1, which the learner
publishes once every live actor is waiting.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.common import algorithms
from rlfleet.common.clients.registry import Welcome
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.config import Experiment
from rlfleet.common.envs import acting_policy, make_vector_env
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.runtime import refusal_is_fatal
from rlfleet.common.tboard import scalar_writer
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.services.actor.episodes import Episodes
from rlfleet.services.actor.member import FleetMember

log = logging.getLogger("rlfleet.actor")


def fleet_size(welcome: Welcome) -> int:
    """The fleet size this actor's exploration is set for: live actors, but never at or below its own index.

    Indices are stable, so when a lower-indexed actor leaves the registry (it died, or a
    partition cut it off) the live count can fall to this actor's index.
    """
    return max(1, welcome.num_actors, welcome.index + 1)


class AckedLog:
    """Every insert replay acked, as ``sender,seq,items`` rows (``actor.acked_log``).

    Written at the ack, line by line: a row survives a kill -9 of the actor,
    so the chaos test can check that replay holds everything it ever acked.
    """

    def __init__(self, path: Path, sender: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.sender = sender
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 (closed in close())
        if self._file.tell() == 0:
            self._file.write("sender,seq,items\n")

    def write(self, seq: int, items: int) -> None:
        self._file.write(f"{self.sender},{seq},{items}\n")

    def close(self) -> None:
        self._file.close()


class ActorService(FleetMember):
    """One actor: env, policy, adder, replay inserts, weight sync, heartbeats."""

    def __init__(self, cfg: Experiment, actor_id: str) -> None:
        super().__init__(cfg, actor_id, "actor")
        self.algo = algorithms.get(cfg.algorithm.name)
        self.index = self.links.welcome.index
        self.num_actors = fleet_size(self.links.welcome)
        # the paramserver's version replaces its weights before any step; its own sampling is seeded per actor
        self.policy = acting_policy(cfg, act_seed=[cfg.seed, self.index, 1])
        self.metrics = ServiceMetrics("actor", self.index)
        self._define_metrics()
        self.env_seed = cfg.seed * 100_003 + self.index * cfg.env.num_envs
        self.envs = make_vector_env(cfg.env, self.env_seed, self.algo.autoreset_mode)
        self.adder = self.algo.make_adder(cfg.algorithm, cfg.env.num_envs, self.envs.single_observation_space,
                                          self.envs.single_action_space, self.algo.autoreset_mode)
        shard = self.index % cfg.replay.shards  # an actor sticks to one replay shard
        # replay knows this incarnation by a sender id nobody can guess (128 random bits after the
        # readable name), kept across reconnects so its resends still dedupe: no other client can
        # claim its seqs and make its next inserts ack as duplicates
        self.sender = f"{actor_id}/{secrets.token_hex(16)}"
        self.acked_log = (AckedLog(Path(cfg.run_dir) / "acked" / f"{actor_id}.csv", self.sender)
                          if cfg.actor.acked_log else None)
        self.replay = InsertClient.from_config(cfg, shard, self.sender,
                                               on_ack=self.acked_log.write if self.acked_log else None)
        self._replay_reconnects = 0
        self._weights_at = time.monotonic()
        self.table = cfg.learner.table
        # The fleet's env steps (what an exploration schedule runs on): the registry's count at the last
        # heartbeat, plus our own steps since times the live actors (they step at about our pace).
        self.env_steps = 0
        self._fleet_steps = (self.links.welcome.fleet_env_steps, 0)
        self.exploration: dict[str, float] = {}
        self._scheduling = True
        self._explore()
        self.version = -1
        self.pending: list[dict[str, np.ndarray]] = []
        self.pending_rows = 0
        self.pending_bytes = 0
        self.episodes = Episodes(self.metrics, cfg.env.num_envs, self.algo.autoreset_mode == "NextStep",
                                 Path(cfg.run_dir) / "episodes" / f"{actor_id}.csv",
                                 scalar_writer(cfg, actor_id, "actor"))
        explore = ", ".join(f"{k} {v:.4g}" for k, v in self.exploration.items()) or "no exploration parameter"
        log.info("actor %s: index %d of %d, %s, replay shard %d, %s protocol", actor_id, self.index,
                 self.num_actors, explore, shard, cfg.sync)

    def _define_metrics(self) -> None:
        m = self.metrics
        self.m_version = m.gauge("weights_version", "Weights version this actor acts with.")
        self.m_stale = m.gauge("weights_staleness", "Versions this actor was behind when it last synced.")
        self.m_exploration = m.gauge("actor_exploration", "The policy's exploration figures for this actor, by name"
                                     " (what its explore() returns).", ("figure",))
        self.m_inserted = m.counter("actor_transitions_sent", "Transitions handed to the replay client.")
        self.m_wait = m.counter("actor_weights_wait_seconds", "Seconds spent waiting for weights.")
        self.m_age = m.gauge("actor_weights_age_seconds",
                             "Seconds since this actor last got newer weights (grows while the paramserver is away).")
        self.m_reconnects = m.counter("reconnects", "Connections re-established to a peer that had gone.", ("peer",))
        for peer in ("replay", "paramserver"):
            self.m_reconnects.labels(peer).inc(0)
        # the insert window: what a partition from replay leaves buffered (bounded by actor.max_unacked_bytes)
        self.m_unacked = m.gauge("actor_unacked_inserts", "Insert messages sent to replay and not yet acked.")
        self.m_unacked_bytes = m.gauge("actor_unacked_bytes", "Bytes of un-acked inserts kept for resending.")
        self.m_unacked_peak = m.gauge("actor_unacked_bytes_peak", "Most un-acked bytes held at once so far.")
        self.m_acked = m.counter("actor_transitions_acked", "Transitions replay acked.")
        self.m_resends = m.counter("actor_insert_resends", "Inserts sent again (no ack in time, or reconnect).")
        self.m_refused = m.counter("actor_transitions_refused", "Transitions replay refused for their values"
                                   " (bad_value: an env's NaN or Inf, ...), dropped by the actor, which goes on.")
        self._counted = {"acked": 0, "resends": 0, "refused": 0}
        self._peak_bytes = 0
        self._replay_state: dict[str, int] = {}

    def fleet_env_steps(self) -> int:
        """Estimated env steps of the whole fleet now (for the exploration schedule)."""
        fleet, own = self._fleet_steps
        return fleet + (self.env_steps - own) * self.num_actors

    def _explore(self) -> None:
        """The policy's exploration for this actor's index, the fleet's size and env steps now.

        While what it returns keeps changing (a schedule runs), the loop asks again
        every step; once it holds still, only heartbeats ask (the fleet's size may change).
        """
        before = self.exploration
        self.exploration = self.policy.explore(self.index, self.num_actors, self.fleet_env_steps())
        self._scheduling = self.exploration != before
        for name, value in self.exploration.items():
            self.m_exploration.labels(name).set(value)

    # -- weights ----------------------------------------------------------------
    def _take(self, got: tuple[int, dict[str, np.ndarray]] | None) -> bool:
        if got is None:
            return False
        version, tensors = got
        self.policy.load_weights(tensors)
        behind = version - self.version if self.version >= 0 else 0
        self.m_stale.set(behind)
        self.version = version
        self.m_version.set(version)
        self._weights_at = time.monotonic()
        self.m_age.set(0.0)
        return True

    def wait_for_version(self, min_version: int) -> bool:
        """Long-poll until a version >= min_version arrives (heartbeating meanwhile); False if stopped."""
        start = time.monotonic()
        while not self._stopping:
            self._heartbeat()
            try:
                got = self.links.reader.wait(min_version, timeout_s=self.cfg.actor.heartbeat_s)
            except (CommTimeout, RemoteError) as exc:
                log.warning("actor %s: waiting for weights v%d: %s", self.actor_id, min_version, exc)
                time.sleep(0.2)
                continue
            if self._take(got):
                self.m_wait.inc(time.monotonic() - start)
                return True
        return False

    def poll(self) -> None:
        if self.links.failing:
            # The paramserver did not answer the last heartbeat (gone, or cut off): a poll would only
            # block for network.timeout_s and stall acting; the heartbeat tells when it answers again.
            return
        try:
            self._take(self.links.reader.get(self.version, timeout_s=self.cfg.network.timeout_s))
        except (CommTimeout, RemoteError) as exc:  # act on the weights we hold
            log.warning("actor %s: weights poll failed (%s); acting on v%d", self.actor_id, exc, self.version)

    def _heartbeat(self) -> None:
        before = self.links.reconnects
        welcome = self.links.heartbeat(self.version, self.env_steps)
        if self.links.reconnects > before:
            self.m_reconnects.labels("paramserver").inc(self.links.reconnects - before)
        if self.replay.reconnects > self._replay_reconnects:
            self.m_reconnects.labels("replay").inc(self.replay.reconnects - self._replay_reconnects)
            self._replay_reconnects = self.replay.reconnects
        self.m_age.set(time.monotonic() - self._weights_at)
        if welcome is not None:
            self._fleet_steps = (welcome.fleet_env_steps, self.env_steps)
        if welcome is not None and (welcome.index, fleet_size(welcome)) != (self.index, self.num_actors):
            if welcome.index >= 0 and welcome.num_actors > 0:
                self.num_actors = fleet_size(welcome)
                if welcome.index != self.index:
                    log.info("actor %s: registry index %d -> %d", self.actor_id, self.index, welcome.index)
                self.index = welcome.index
        self._explore()

    # -- data -------------------------------------------------------------------
    def _queue(self, columns: dict[str, np.ndarray]) -> None:
        n = len(next(iter(columns.values()))) if columns else 0
        if n:
            self.pending.append(columns)
            self.pending_rows += n
            self.pending_bytes += sum(c.nbytes for c in columns.values())
        if self.pending_rows >= self.cfg.actor.insert_batch or self.pending_bytes >= self.cfg.actor.insert_bytes:
            self._send_pending()

    def _send_pending(self, deadline_s: float | None = None) -> None:
        """Insert what is pending; blocks while replay holds acks (heartbeating meanwhile).

        While running it waits until stopped; at stop it waits at most ``deadline_s``.
        """
        if not self.pending:
            return
        batch = {k: np.concatenate([c[k] for c in self.pending]) for k in self.pending[0]}
        rows = self.pending_rows
        self.pending, self.pending_rows, self.pending_bytes = [], 0, 0
        priorities = self.policy.priorities(batch)
        end = None if deadline_s is None else time.monotonic() + deadline_s
        while end is not None or not self._stopping:
            try:
                self.replay.insert(self.table, batch, priorities, timeout_s=self.cfg.actor.heartbeat_s)
                self.m_inserted.inc(rows)
                self._replay_metrics()  # right after the window grew: the peak is exact
                return
            except CommTimeout:
                self._replay_metrics()
                if end is not None and time.monotonic() >= end:
                    raise
                self._heartbeat()

    def _replay_metrics(self) -> None:
        r = self.replay
        # for /healthz (another thread): seqs as exact integers, which a gauge (a float) is not;
        # every seq in [first_seq, acked_below) is acked
        self._replay_state = {"first_seq": r.first_seq, "acked_below": r.acked_below, "next_seq": r.next_seq,
                              "unacked": r.unacked, "unacked_bytes": r.unacked_bytes}
        self.m_unacked.set(r.unacked)
        self.m_unacked_bytes.set(r.unacked_bytes)
        if r.unacked_bytes > self._peak_bytes:
            self._peak_bytes = r.unacked_bytes
            self.m_unacked_peak.set(r.unacked_bytes)
        for key, metric, now in (("acked", self.m_acked, r.items_acked), ("resends", self.m_resends, r.resends),
                                 ("refused", self.m_refused, r.items_refused)):
            if now > self._counted[key]:
                metric.inc(now - self._counted[key])
                self._counted[key] = now

    # -- loop -------------------------------------------------------------------
    def run(self) -> None:
        # replay refused an insert for a reason the next one would repeat (schema_mismatch, ...); one refused for
        # its values (an env's NaN: bad_value) is dropped and counted by the client (actor_transitions_refused)
        with refusal_is_fatal(f"replay at {self.replay.address} refused our transitions"):
            self._run()

    def _run(self) -> None:
        cfg = self.cfg
        if not self.wait_for_version(0):
            return
        obs, _ = self.envs.reset(seed=[self.env_seed + j for j in range(cfg.env.num_envs)])  # type: ignore[arg-type]
        self.adder.reset(obs)
        steps_in_round = 0
        since_poll = 0
        last_beat = time.monotonic()
        while not self._stopping:
            if self._scheduling:
                self._explore()
            actions, extras = self.policy.act(obs)
            obs, rewards, terminated, truncated, infos = self.envs.step(actions)
            self._queue(self.adder.add(actions, extras, obs, rewards, terminated, truncated, infos, self.version))
            self.env_steps += cfg.env.num_envs
            self.episodes.step(self.env_steps, self.version, rewards, terminated, truncated)
            self.replay.poll()
            self._replay_metrics()
            if time.monotonic() - last_beat >= cfg.actor.heartbeat_s:
                self._heartbeat()
                last_beat = time.monotonic()
            if cfg.sync == "async":
                since_poll += 1
                if since_poll >= cfg.actor.poll_every:
                    since_poll = 0
                    self.poll()
            else:
                steps_in_round += 1
                if steps_in_round >= cfg.actor.steps_per_round:
                    steps_in_round = 0
                    self._end_round()
                    last_beat = time.monotonic()

    def _end_round(self) -> None:
        """Barrier: every insert of round k acked, then wait for version k + 1."""
        self._send_pending()
        while not self._stopping:
            try:
                self.replay.flush(timeout_s=self.cfg.actor.heartbeat_s)
                break
            except CommTimeout:
                self._replay_metrics()
                self._heartbeat()
        self.wait_for_version(self.version + 1)

    def health(self) -> dict[str, Any]:
        return {"ok": not self._stopping, "actor_id": self.actor_id, "index": self.index,
                "version": self.version, **self.exploration, "env_steps": self.env_steps,
                "replay": self._replay_state}

    def close(self) -> None:
        try:
            self._send_pending(deadline_s=2.0)
            self.replay.flush(timeout_s=2.0)
        except (CommTimeout, RemoteError) as exc:
            log.warning("actor %s: %s un-acked at stop: %s", self.actor_id, self.replay.unacked, exc)
        self._replay_metrics()  # the last acks (and refusals) counted too
        self.links.close()
        self.replay.close()
        self.envs.close()
        self.episodes.close()
        if self.acked_log is not None:
            self.acked_log.close()
