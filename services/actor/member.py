"""What every member on the acting side holds before its own parts: the actor, the gradient worker
and the evaluator are each a FleetMember (its config and id, its stop flag, torch's intra-op threads
set for acting, and its links to the paramserver: registry and weights)."""

from __future__ import annotations

import torch

from rlfleet.common.clients.fleet_links import FleetLinks
from rlfleet.common.config import Experiment


class FleetMember:
    def __init__(self, cfg: Experiment, actor_id: str, role: str) -> None:
        self.cfg = cfg
        self.actor_id = actor_id
        self._stopping = False
        torch.set_num_threads(cfg.actor.torch_threads)
        self.links = FleetLinks(cfg, actor_id, role=role)

    def stop(self) -> None:
        """Ask the loop to end (SIGTERM); it finishes its step and returns."""
        self._stopping = True
