"""One parameter-server shard: the request loop that holds the shard's parts and routes to them.

Every shard holds its slice of the weights (:class:`WeightsStore`, the last two
versions of each model), the long polls parked on it (:class:`LongPolls`), the
/dev/shm files of its versions (:class:`ShmVersions`) and the optimizer that
applies gradient pushes (:class:`GradientApplier`); :class:`WeightsRequests`
and :class:`GradientRequests` answer the requests that use them. Shard 0 also
holds the registry of live actors (:class:`Registry`, answered by
:class:`RegistryRequests`) and the round barrier (:class:`RoundBarrier`).
"""

from __future__ import annotations

import time
from typing import Any

from rlfleet.common import weights_shm as shmlib
from rlfleet.common.config.sections import DEFAULT_MAX_GRADIENT_NORM, GradientsConfig
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.server import Peer, Server
from rlfleet.services.paramserver.barrier import RoundBarrier
from rlfleet.services.paramserver.gradient_requests import GradientRequests
from rlfleet.services.paramserver.gradients import GradientApplier
from rlfleet.services.paramserver.long_polls import LongPolls
from rlfleet.services.paramserver.metrics import ShardMetrics
from rlfleet.services.paramserver.registry import DEFAULT_MAX_MEMBERS, Registry
from rlfleet.services.paramserver.registry_requests import RegistryRequests
from rlfleet.services.paramserver.shm_versions import ShmVersions
from rlfleet.services.paramserver.step_counts import StepCountsFile
from rlfleet.services.paramserver.weights_requests import WeightsRequests
from rlfleet.services.paramserver.weights_store import WeightsStore


class ShardServer(Server):
    """A ROUTER loop serving shard ``shard`` of ``num_shards``.

    ``shm_dir`` is where version files go (see :class:`ShmVersions`); ``checkpoint`` is where the
    gradient applier keeps what pushes made of the slice.
    """

    def __init__(
        self,
        metrics: ServiceMetrics,
        bind: str,
        shard: int,
        num_shards: int,
        liveness_s: float,
        shm: bool = True,
        shm_dir: str = shmlib.SHM_DIR,
        gradients: GradientsConfig | None = None,
        max_gradient_norm: float = DEFAULT_MAX_GRADIENT_NORM,
        checkpoint: str | None = None,
        experiment: str = "",
        max_members: int = DEFAULT_MAX_MEMBERS,
        step_counts: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(metrics, bind, **kw)
        self.shard = shard
        self.num_shards = num_shards
        m = ShardMetrics(metrics)
        self.weights = WeightsStore(shard, num_shards)
        self.long_polls = LongPolls(m.waits_parked)
        self.shm = ShmVersions(self.name, shard, shm, shm_dir, self.tick_interval_s)
        self.registry = Registry(liveness_s, max_members=max_members) if shard == 0 else None
        self.step_counts = StepCountsFile(step_counts, self.registry) if self.registry is not None else None
        if self.step_counts is not None:
            self.step_counts.restore()
        self.weights_requests = WeightsRequests(self, self.weights, self.long_polls, self.shm, self.registry, m)
        applier = GradientApplier(gradients or GradientsConfig(), checkpoint, shard, experiment, max_gradient_norm)
        self.gradient_requests = GradientRequests(self, applier, self.weights, self.weights_requests,
                                                  self.registry, m)
        self.gradient_requests.restore()
        w = self.weights_requests
        for mtype, handler in (("publish", w.on_publish), ("get", w.on_get), ("wait", w.on_wait),
                               ("info", self.on_info), ("push_gradients", self.gradient_requests.on_push_gradients)):
            self.route(mtype, handler)
        self.registry_requests: RegistryRequests | None = None
        self.barrier: RoundBarrier | None = None
        if self.registry is not None:
            r = self.registry_requests = RegistryRequests(self, self.registry, m.live_actors)
            self.barrier = RoundBarrier(self, self.registry, self.long_polls, m.barrier_wait)
            for mtype, handler in (("hello", r.on_hello), ("heartbeat", r.on_heartbeat),
                                   ("goodbye", r.on_goodbye), ("barrier", self.barrier.on_barrier)):
                self.route(mtype, handler)

    def on_info(self, peer: Peer, msg: Message) -> None:
        policy = self.weights.default
        stats: dict[str, Any] = {
            "versions": policy.versions,
            "layout": policy.layout.fingerprint if policy.layout else "",
            "num_shards": self.num_shards,
            "waits_parked": len(self.long_polls),
            "shm": self.shm.enabled,
            "models": {name: m.versions for name, m in self.weights.models.items()},
            # where the asking sender's push seqs start (common/wire/dedup.py), not a clock's word
            "first_seq": self.gradient_requests.applier.dedup.first_seq(msg.sender),
        }
        if self.registry is not None and self.barrier is not None:
            stats["actors"] = [[m.actor_id, m.role, m.index] for m in self.registry.members.values()][:200]
            stats["num_actors"] = self.registry.num_actors
            stats["barriers_waiting"] = len(self.barrier)
            stats["fleet_env_steps"] = self.registry.fleet_env_steps  # what a learner with no checkpoint resumes at
        self.reply(peer, Message("info_reply", {"service": "paramserver", "shard": self.shard, "stats": stats}))

    def tick(self) -> None:
        now = time.monotonic()
        self.weights_requests.tick(now)
        self.shm.tick(now)
        self.gradient_requests.tick(now)
        if self.registry_requests is not None and self.barrier is not None:
            self.registry_requests.tick()
            self.barrier.tick(now)
        if self.step_counts is not None:
            self.step_counts.tick(now)

    def close(self) -> None:
        if self.step_counts is not None:
            self.step_counts.write()
        self.gradient_requests.close()
        self.shm.close()
        super().close()
