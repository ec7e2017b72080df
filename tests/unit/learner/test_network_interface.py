"""``network.interface`` (issue 43, item 4): one interface for the fleet's traffic, on a real one (``lo``).

It gives replay and paramserver their ZeroMQ bind address (the interface's) and the learner ranks
their GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME; an interface the host does not have is refused with
the ones it has. Real processes: a replay bound through it, and two learner ranks forming a gloo
group and all-reducing over it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.replay_helpers import ask
from harness.service_procs import CARTPOLE, ROOT, ServiceProcess
from rlfleet.common import config as config_mod
from rlfleet.common.config import ConfigError
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.transport import free_tcp_port


def test_the_interface_gives_the_bind_address() -> None:
    cfg = config_mod.load(CARTPOLE, environ={}, sets=["network.interface=lo", "network.bind_host=*"])
    assert cfg.bind_address("replay", 0) == "tcp://127.0.0.1:5550"
    assert cfg.bind_address("paramserver", 0) == "tcp://127.0.0.1:5560"
    assert config_mod.load(CARTPOLE, environ={}).bind_address("replay", 0) == "tcp://*:5550"  # unset: bind_host
    missing = config_mod.load(CARTPOLE, environ={}, sets=["network.interface=nosuch0"])
    with pytest.raises(ConfigError, match=r"nosuch0.*no such interface; allowed: \[.*'lo'"):
        missing.bind_address("replay", 0)


def test_a_replay_binds_the_interfaces_address(tmp_path: Path) -> None:
    """bind_host '*' (every interface) would be refused without keys; the interface lo binds 127.0.0.1."""
    port = free_tcp_port()
    proc = ServiceProcess("replay", tmp_path, [f"network.replay=[tcp://127.0.0.1:{port}]", "network.bind_host=*",
                                               "network.interface=lo"])
    try:
        proc.wait_healthy(120)
        assert ask(f"tcp://127.0.0.1:{port}", Message("info", {})).type == "info_reply"
        assert "serving on tcp://127.0.0.1:" in proc.log()
    finally:
        assert proc.stop() == 0


RANK = """
import json, os, sys
import torch, torch.distributed as dist
from rlfleet.common import config as config_mod
from rlfleet.services.learner import ranks
cfg = config_mod.load(sys.argv[1], environ={}, sets=sys.argv[2:])
group = ranks.join(cfg, torch.device("cpu"))
x = torch.tensor([float(group.rank + 1)])
dist.all_reduce(x)
print(json.dumps({"rank": group.rank, "sum": x.item(), "backend": group.backend,
                  "env": {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}}))
ranks.leave()
"""


def test_two_learner_ranks_pin_their_collectives_to_the_interface(tmp_path: Path) -> None:
    sets = ["learners=2", f"learner.rendezvous=tcp://127.0.0.1:{free_tcp_port()}", "learner.collective_timeout_s=60",
            "network.interface=lo"]
    env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    env["PYTHONPATH"] = str(ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(CARTPOLE), *sets], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(o["rank"] for o in outs) == [0, 1]
    for o in outs:
        assert o["sum"] == 3.0 and o["backend"] == "gloo"  # the group formed and reduced over lo
        assert o["env"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
