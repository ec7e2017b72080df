"""common/roles.py names every role once; what derives from it agrees with what the code does."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from harness.fleet_helpers import CONFIGS
from rlfleet.cli.forkserver import KIND_OF
from rlfleet.cli.launcher import STOP_ORDER, plan
from rlfleet.cli.zygote import PRELOAD
from rlfleet.common import config as config_mod
from rlfleet.common import security
from rlfleet.common.roles import CLIENTS, NAMES, REGISTERED, ROLES, Role, role
from rlfleet.services.paramserver.registry import ROLES as REGISTRY_ROLES


@pytest.mark.parametrize("r", ROLES, ids=lambda r: r.name)
def test_every_role_has_an_entry_module_with_build(r: Role) -> None:
    for module in (r.entry, *r.preload):
        importlib.import_module(module)
    assert callable(importlib.import_module(r.entry).build)


def test_fork_servers_preload_the_roles_they_fork() -> None:
    for r in ROLES:
        kind = KIND_OF[r.name]
        assert kind == ("heavy" if r.needs_torch else "light")
        assert {r.entry, *r.preload} <= set(PRELOAD[kind])
    assert "torch" not in PRELOAD["light"]


def test_derived_lists() -> None:
    assert NAMES == ("replay", "paramserver", "learner", "actor", "evaluator", "modeler", "planner")
    assert STOP_ORDER == tuple(reversed(NAMES))
    assert CLIENTS == security.DEFAULT_CLIENTS == ("learner", "actor", "evaluator", "modeler", "planner")
    assert REGISTERED == REGISTRY_ROLES == ("actor", "evaluator")
    with pytest.raises(KeyError, match="roles: replay"):
        role("gradient-worker")


def test_a_local_fleet_has_every_role_in_start_order(tmp_path: Path) -> None:
    cfg = config_mod.load(str(CONFIGS / "cartpole-dqn.yaml"), ["evaluator.enabled=true"])
    _, members = plan(cfg, 3, tmp_path, inproc=True)
    stores = [f"{name}-{i}" for name, n in (("replay", cfg.replay.shards), ("paramserver", cfg.paramserver.shards))
              for i in range(n)]
    assert [m.label for m in members] == [*stores, "learner", "actor-0", "actor-1", "actor-2", "evaluator"]
    assert [m.actor_id for m in members if m.actor_id] == ["actor-0", "actor-1", "actor-2", "evaluator"]

    assert security.fleet_roles(cfg) == ("learner", "actor", "evaluator")
    no_eval = config_mod.load(str(CONFIGS / "cartpole-dqn.yaml"), ["evaluator.enabled=false"])
    assert security.fleet_roles(no_eval) == ("learner", "actor")


def test_a_planning_fleet_adds_the_modeler_and_the_planners(tmp_path: Path) -> None:
    cfg = config_mod.load(str(CONFIGS / "cartpole-dynaq.yaml"), ["planning.planners=3", "evaluator.enabled=false"])
    _, members = plan(cfg, 1, tmp_path, inproc=True)
    assert [m.label for m in members][-4:] == ["modeler", "planner-0", "planner-1", "planner-2"]
    assert [m.actor_id for m in members if m.name == "planner"] == ["planner-0", "planner-1", "planner-2"]
    assert security.fleet_roles(cfg) == ("learner", "actor", "modeler", "planner")
    off = config_mod.load(str(CONFIGS / "cartpole-dynaq.yaml"), ["planning.enabled=false"])
    assert {"modeler", "planner"}.isdisjoint(m.name for m in plan(off, 1, tmp_path, inproc=True)[1])

