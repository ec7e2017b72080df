"""From a role's name to its running service: the one place that imports a service module by name.

Imported only when a service runs: the entry module of a learner or an actor imports torch, which the
replay and paramserver images do not carry.
"""

from __future__ import annotations

import importlib

from rlfleet.common.config import Experiment
from rlfleet.common.roles import role
from rlfleet.common.runtime import Service, ServiceArgs, run_service


def build(cfg: Experiment, args: ServiceArgs) -> Service:
    """The service of role ``args.name``, made by its entry module's ``build``."""
    module = importlib.import_module(role(args.name).entry)
    return module.build(cfg, args)  # type: ignore[no-any-return]


def run(cfg: Experiment, args: ServiceArgs) -> int:
    """Run the service of role ``args.name`` in the foreground (`rlfleet service NAME`); its exit code."""
    return run_service(cfg, args, build)
