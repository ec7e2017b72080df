"""The roles of a fleet, named once: what the launcher, the fork servers, the keys and the registry
need to know of each.

A role's service is built by the ``build(cfg, args)`` of its entry module (common/runtime.py's
contract). The module is named here as a string, not imported: common/ never imports services/;
the command line (cli/dispatch.py) imports it when it runs the role.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Role:
    name: str
    entry: str
    """Module whose ``build(cfg, args)`` makes the service (`rlfleet service NAME` runs it)."""
    needs_torch: bool
    """Imports torch: its image carries torch, and the launcher's heavy fork server forks it."""
    server: bool
    """Binds the sockets the others connect to (one CurveZMQ server key pair for all); the other roles are
    clients, each with a key pair of its own."""
    registers: bool
    """Says hello to paramserver shard 0's registry of live actors."""
    single: bool
    """One instance per fleet (named without an index); the others run as several shards or actors."""
    preload: tuple[str, ...] = ()
    """Modules its ``build`` imports on first use, which a fork server imports ahead."""


# In start order: stores first, then the learner everyone waits for, then those that produce. A local
# fleet stops in the reverse order.
ROLES: tuple[Role, ...] = (
    Role("replay", "rlfleet.services.replay.main", needs_torch=False, server=True, registers=False, single=False),
    Role("paramserver", "rlfleet.services.paramserver.main", needs_torch=False, server=True, registers=False,
         single=False),
    Role("learner", "rlfleet.services.learner.main", needs_torch=True, server=False, registers=False, single=True),
    Role("actor", "rlfleet.services.actor.main", needs_torch=True, server=False, registers=True, single=False,
         preload=("rlfleet.services.actor.actor",)),
    Role("evaluator", "rlfleet.services.actor.main", needs_torch=True, server=False, registers=True, single=True,
         preload=("rlfleet.services.actor.evaluator",)),
    # parallel Dyna-Q (planning.enabled): the world-model learner, and planners that roll it forward
    Role("modeler", "rlfleet.services.modeler.main", needs_torch=True, server=False, registers=False, single=True,
         preload=("rlfleet.services.modeler.modeler",)),
    Role("planner", "rlfleet.services.planner.main", needs_torch=True, server=False, registers=False, single=False,
         preload=("rlfleet.services.planner.planner",)),
)

BY_NAME: dict[str, Role] = {r.name: r for r in ROLES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
CLIENTS: tuple[str, ...] = tuple(r.name for r in ROLES if not r.server)
REGISTERED: tuple[str, ...] = tuple(r.name for r in ROLES if r.registers)


def role(name: str) -> Role:
    """The role called ``name``; KeyError naming the known ones if there is none."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no role {name!r}; roles: {', '.join(NAMES)}") from None
