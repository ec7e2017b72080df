"""A network partition between one actor and the core of a training fleet.

Three hosts made of network namespaces on one bridge (harness/netns.py): "core"
runs replay (durability ``wal``), paramserver and learner; "cut" and "steady"
run one actor each. All are real ``rlfleet service`` processes training
CartPole. Once the learner trains, every packet between the cut actor and
core is dropped for 20 s (nftables in the actor's namespace: silent loss, no
TCP reset), then the link is restored. Checks:

- the cut actor buffers within its bound: its un-acked bytes never exceed
  ``actor.max_unacked_bytes`` (the peak gauge, set right after every insert),
  and do reach it (the cut really held its inserts);
- it resends after the link returns: everything it buffered is acked soon
  after, and it steps again;
- nothing acked is lost and nothing is duplicated: replay's write-ahead log
  holds one record per stored (actor id, seq); every seq each actor counts as
  acked is there, and no (actor id, seq) is there twice;
- the steady actor never stops: its env steps rise all through the cut.

Needs root, ``ip`` and ``nft``. Under CI=true a machine without them fails
the test with the reason (.ci/run installs them); elsewhere it skips.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import netns, skips
from harness.fleet_helpers import CONFIGS, ROOT
from rlfleet.common.clients.registry import Welcome
from rlfleet.services.actor.actor import fleet_size
from rlfleet.services.replay.storage import read_log_file

CUT_S = 20.0
BOUND = 96 * 1024  # actor.max_unacked_bytes: about 26 inserts
INSERT_BYTES = 64 * 58  # an insert of 64 CartPole transitions (n-step columns and priorities)
REPLAY_PORT, PS_PORT = 5550, 5560
METRICS = {"replay": 9101, "paramserver": 9102, "learner": 9103, "actor": 9100}


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[netns.Lab]:
    reason = netns.unavailable()
    if reason is not None:
        skips.missing("netns", f"network namespaces unusable: {reason}")
    with netns.Lab(tmp_path / "logs") as lab:  # namespaces and processes go, whatever happens
        yield lab


@dataclass
class Sample:
    t: float
    unacked_bytes: float
    unacked: int
    cut_steps: float
    steady_steps: float

    def __str__(self) -> str:
        return (f"cut+{self.t:4.1f}s: cut actor {self.unacked_bytes:6.0f} B in {self.unacked:3d} un-acked inserts, "
                f"{self.cut_steps:6.0f} env steps; steady actor {self.steady_steps:6.0f} env steps")


class Fleet:
    """The services of one run, started in their hosts' namespaces."""

    def __init__(self, lab: netns.Lab, run_dir: Path) -> None:
        self.lab = lab
        self.run_dir = run_dir
        self.core = lab.add_host("core", 1)
        self.hosts = {"cut": lab.add_host("cut", 11), "steady": lab.add_host("steady", 12)}
        self.procs: dict[str, netns.Proc] = {}
        self.sets = [
            f"network.replay=[tcp://{self.core.addr}:{REPLAY_PORT}]",
            f"network.paramserver=[tcp://{self.core.addr}:{PS_PORT}]",
            f"run_dir={run_dir}",
            "replay.durability=wal",  # every stored insert is a log record: what the test counts
            "replay.checkpoint_every_s=3600",  # no snapshot, so no log segment is dropped during the run
            "actor.max_unacked=256",  # the byte bound, not the count, is what the cut reaches
            f"actor.max_unacked_bytes={BOUND}",
            "evaluator.enabled=false",
            "security.insecure=true",  # hosts of a lab network over plain TCP (off loopback: refused by default)
        ]

    def start(self, name: str, host: netns.Host, service: str, port: int, *extra: str) -> netns.Proc:
        argv = [sys.executable, "-m", "rlfleet.cli", "service", service, "--config",
                str(CONFIGS / "cartpole-dqn.yaml"), *[a for s in self.sets for a in ("--set", s)],
                "--set", f"metrics.port={port}", *extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
        self.procs[name] = self.lab.start(name, host, argv, env)
        return self.procs[name]

    def url(self, name: str) -> str:
        proc = self.procs[name]
        port = METRICS["actor" if name.startswith("actor") else name]
        return f"http://{proc.host.addr}:{port}"

    def metrics(self, name: str) -> dict[str, float]:
        text = self.lab.http_get(self.url(name) + "/metrics").decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[s.name] = out.get(s.name, 0.0) + s.value
        return out

    def health(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.lab.http_get(self.url(name) + "/healthz")))

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.alive(), f"{name} exited with {proc.popen.returncode}:\n{proc.tail()}"

    def wait(self, what: str, ok: Any, timeout_s: float) -> Any:
        """Poll ``ok()`` (errors count as not yet) until it returns something truthy."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                last = ok()
            except (OSError, ValueError, KeyError) as exc:
                last = exc
            if last and not isinstance(last, Exception):
                return last
            time.sleep(0.5)
        logs = "\n".join(f"--- {n}\n{p.tail(1500)}" for n, p in self.procs.items())
        raise AssertionError(f"{what}: not within {timeout_s:g} s (last: {last!r})\n{logs}")

    def sample(self, t: float) -> Sample:
        self.check_alive()
        cut = self.metrics("actor-cut")
        return Sample(t, cut["rlfleet_actor_unacked_bytes"], int(cut["rlfleet_actor_unacked_inserts"]),
                      cut["rlfleet_env_steps_total"], self.metrics("actor-steady")["rlfleet_env_steps_total"])

    def wal_seqs(self) -> dict[str, Counter[int]]:
        """(actor id -> seq -> records) of every insert replay stored, from its write-ahead log.

        An actor sends as "<actor id>/<random token>" (one token per process; none restarts here)."""
        out: dict[str, Counter[int]] = {}
        for seg in sorted((self.run_dir / "replay" / "shard-0").glob("wal-*.log")):
            for header, _ in read_log_file(seg):
                if header["op"] == "insert":
                    out.setdefault(header["sender"].split("/")[0], Counter())[int(header["seq"])] += 1
        return out


def test_fleet_size_covers_own_index_when_lower_actors_left() -> None:
    # The registry keeps indices stable: with actor 0 cut off and expired, actor 1 hears
    # "index 1, 1 live actor"; its Ape-X epsilon must still be defined (it crashed here before).
    assert fleet_size(Welcome(index=1, num_actors=1, liveness_s=5.0)) == 2
    assert fleet_size(Welcome(index=0, num_actors=3, liveness_s=5.0)) == 3
    assert fleet_size(Welcome(index=0, num_actors=0, liveness_s=5.0)) == 1


@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_partitioned_actor_buffers_resends_and_loses_nothing(lab: netns.Lab, tmp_path: Path) -> None:
    fleet = Fleet(lab, tmp_path / "run")
    core = fleet.core
    fleet.start("replay", core, "replay", METRICS["replay"])
    fleet.start("paramserver", core, "paramserver", METRICS["paramserver"])
    fleet.wait("replay and paramserver healthy",
               lambda: fleet.health("replay")["ok"] and fleet.health("paramserver")["ok"], 60)
    fleet.start("learner", core, "learner", METRICS["learner"])
    for role, host in fleet.hosts.items():
        fleet.start(f"actor-{role}", host, "actor", METRICS["actor"], "--actor-id", f"actor-{role}")
    fleet.wait("the learner training on both actors' transitions",
               lambda: fleet.metrics("learner")["rlfleet_learner_updates_total"] > 0
               and all(fleet.health(f"actor-{r}")["replay"]["acked_below"] > fleet.health(f"actor-{r}")
                       ["replay"]["first_seq"] for r in fleet.hosts), 90)

    cut = fleet.hosts["cut"]
    resends_before = fleet.metrics("actor-cut")["rlfleet_actor_insert_resends_total"]
    lab.cut(cut, [core])
    t_cut = time.monotonic()
    timeline: list[Sample] = []
    while time.monotonic() - t_cut < CUT_S:
        timeline.append(fleet.sample(time.monotonic() - t_cut))
        time.sleep(1.0)
    during = fleet.health("actor-cut")["replay"]
    lab.heal(cut)
    t_heal = time.monotonic()
    for x in timeline:
        print(x)

    # The cut held: the cut actor's window filled up to the bound and no further.
    peak = fleet.metrics("actor-cut")["rlfleet_actor_unacked_bytes_peak"]
    assert peak <= BOUND, f"un-acked bytes peaked at {peak:.0f}, above actor.max_unacked_bytes={BOUND}"
    assert max(x.unacked_bytes for x in timeline) > BOUND - 2 * INSERT_BYTES, (
        f"the cut actor never buffered close to its bound of {BOUND} bytes: the cut did not hold its inserts")

    # The steady actor never stopped: its env steps rose over every 6 samples (about 6 s) of the cut.
    # An actor blocked by the cut link stops for all of it; 6 s leaves room for a loaded machine.
    stalls = [(a.t, a.steady_steps, b.steady_steps) for a, b in zip(timeline, timeline[6:], strict=False)
              if b.steady_steps <= a.steady_steps]
    assert not stalls, f"the steady actor stopped during the cut (at s, steps, steps 6 samples later): {stalls}"

    # After the link returns, everything buffered during the cut is resent and acked, and it acts again.
    after = fleet.wait("the cut actor's buffered inserts acked after the link returned",
                       lambda: (r := fleet.health("actor-cut")["replay"])["acked_below"] >= during["next_seq"] and r,
                       30)
    print(f"healed: the {during['next_seq'] - during['acked_below']} inserts buffered during the cut were acked "
          f"{time.monotonic() - t_heal:.1f} s after the link returned")
    m = fleet.metrics("actor-cut")
    # Resent while cut off (the back-off timer) and at once on the new connection (the handshake): the
    # copies that reached replay after the link returned are what got acked.
    assert m["rlfleet_actor_insert_resends_total"] > resends_before, "the cut actor resent nothing"
    fleet.wait("the cut actor stepping again",
               lambda: fleet.metrics("actor-cut")["rlfleet_env_steps_total"] > m["rlfleet_env_steps_total"] + 200, 30)

    # Nothing acked is lost, nothing is duplicated: count replay's stored inserts by (actor id, seq).
    acked = {r: fleet.health(f"actor-{r}")["replay"] for r in fleet.hosts}
    stored = fleet.wal_seqs()
    for role, r in acked.items():
        seqs = stored.get(f"actor-{role}", Counter())
        twice = sorted(s for s, n in seqs.items() if n > 1)
        assert not twice, f"actor-{role}: {len(twice)} inserts stored more than once, e.g. seqs {twice[:5]}"
        missing = [s for s in range(r["first_seq"], r["acked_below"]) if s not in seqs]
        assert not missing, (f"actor-{role}: {len(missing)} acked inserts are not in replay, e.g. seqs "
                             f"{missing[:5]} (acked: [{r['first_seq']}, {r['acked_below']}))")
    assert acked["cut"]["acked_below"] >= after["acked_below"] > during["acked_below"]
    fleet.check_alive()
