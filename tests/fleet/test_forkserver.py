"""The launcher's fork servers: members forked from warm zygotes behave like processes started fresh.

Each member has its own pid, session and log, is this process's child (exit
code, signals), dies alone on kill -9 and can be restarted; Ctrl-C on `rlfleet
up` (also while the members are still starting, before they answer /healthz)
leaves no process behind; a
zygote that is gone makes the launcher start members as fresh processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness.fleet_helpers import CONFIGS, ROOT, tagged, wait_for
from rlfleet.cli.fleetview import scrape
from rlfleet.cli.forkserver import KINDS, ForkedProcess, ForkServerError, ForkServers, Zygote
from rlfleet.cli.launcher import Fleet, Member, make_run_dir, plan
from rlfleet.cli.main import SERVICE_NAMES
from rlfleet.common import config as config_mod
from rlfleet.common.roles import NAMES

CARTPOLE = CONFIGS / "cartpole-dqn.yaml"


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_cli_lists_every_service() -> None:
    assert set(SERVICE_NAMES) == set(NAMES)


def test_forked_command_has_its_own_pid_session_log_and_exit_code(tmp_path: Path) -> None:
    fs = ForkServers()
    try:
        ok = fs.fork("replay", ["config", "--config", str(CARTPOLE)], tmp_path / "ok.log")
        bad = fs.fork("actor", ["config", "--config", str(tmp_path / "missing.yaml")], tmp_path / "bad.log")
        assert isinstance(ok, ForkedProcess) and ok.pid != bad.pid
        assert ok.wait(60) == 0
        assert bad.wait(60) == 2  # what `rlfleet config` exits with on a missing file
        ok_log, bad_log = (tmp_path / "ok.log").read_text(), (tmp_path / "bad.log").read_text()
        assert "forked by the light fork server" in ok_log and "name: cartpole-dqn" in ok_log
        assert "forked by the heavy fork server" in bad_log and "does not exist" in bad_log
        assert "cartpole" not in bad_log
        zygote_pids = {z.proc.pid for z in fs.zygotes.values()}
        assert ok.pid not in zygote_pids and bad.pid not in zygote_pids
    finally:
        fs.close()
    assert all(z.proc.returncode is not None for z in fs.zygotes.values())


def test_a_gone_zygote_is_an_error_not_a_hang(tmp_path: Path) -> None:
    z = Zygote("light", ROOT)
    try:
        z.proc.kill()
        z.proc.wait(10)
        with pytest.raises(ForkServerError, match="light fork server"):
            z.fork(["config"], tmp_path / "x.log", str(ROOT), dict(os.environ), timeout_s=10)
    finally:
        z.close()


@pytest.mark.e2e
def test_fleet_members_are_forked_die_alone_and_restart(tmp_path: Path) -> None:
    cfg = config_mod.load(CARTPOLE, environ={}, sets=["evaluator.enabled=false"])
    run_dir = make_run_dir(cfg, str(tmp_path))
    cfg, members = plan(cfg, 2, run_dir, inproc=False)
    fleet = Fleet(cfg, members, run_dir, inproc=False)
    assert fleet.forkservers is not None
    zygotes = list(fleet.forkservers.zygotes.values())
    zygote_pids = {z.proc.pid for z in zygotes}
    by = {m.label: m for m in members}

    def proc(m: Member) -> ForkedProcess:
        assert isinstance(m.proc, ForkedProcess), f"{m.label} was not forked: {m.proc!r}"
        return m.proc

    try:
        fleet.start()
        fleet.wait_healthy(180)
        pids = {m.label: proc(m).pid for m in members}
        assert len(set(pids.values())) == len(members)
        for m in members:
            pid = pids[m.label]
            assert parent_of(pid) == os.getpid(), m.label  # reparented to the launcher: it can wait for it
            assert os.getsid(pid) == pid and os.getpgid(pid) == pid, m.label  # session of its own
            assert pid not in zygote_pids
            assert f"pid {pid} forked by the" in (run_dir / "logs" / f"{m.label}.log").read_text()
        # Learning goes on: the actors step and the learner updates.
        wait_for(lambda: scrape(by["learner"].url, health_only=True).health.get("updates", 0) > 0, 120,
                 "a learner update")

        victim = by["actor-1"]
        proc(victim).kill()
        assert proc(victim).wait(10) == -signal.SIGKILL
        time.sleep(0.5)
        for m in members:
            if m is not victim:
                assert m.exit_code() is None, f"{m.label} died with actor-1"
        fleet.restart(victim)
        assert proc(victim).pid != pids["actor-1"]
        wait_for(lambda: scrape(victim.url, health_only=True).healthy, 120, "actor-1 healthy again")
        wait_for(lambda: scrape(victim.url, health_only=True).health.get("env_steps", 0) > 0, 120,
                 "actor-1 stepping again")
        assert (run_dir / "logs" / "actor-1.log").read_text().count("forked by the heavy fork server") == 2

        # A zygote that is gone: the next restart is a fresh process, and works.
        fleet.forkservers.zygotes["heavy"].proc.kill()
        proc(victim).kill()
        proc(victim).wait(10)
        fleet.restart(victim)
        assert isinstance(victim.proc, subprocess.Popen)
        assert fleet.forkservers is None
        wait_for(lambda: scrape(victim.url, health_only=True).healthy, 180, "actor-1 healthy as a fresh process")
    finally:
        fleet.stop()
    for m in members:
        assert m.exit_code() is not None, f"{m.label} still runs after stop"
        assert m.proc is not None and m.proc.poll() == 0, f"{m.label} did not stop cleanly: {m.proc.poll()}"
    assert all(z.proc.returncode is not None for z in zygotes), "a zygote outlived the fleet"


def run_up_and_interrupt(tmp_path: Path, when: str) -> tuple[int, str, list[int]]:
    """`rlfleet up` in a session of its own; SIGINT to its process group (what Ctrl-C does) at ``when``."""
    tag = uuid.uuid4().hex
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RLFLEET_TEST_TAG": tag}
    # a budget the test never reaches: a run that ends on it stops its members one by one, which would
    # look like a start (some healthy, some not) to an interrupt that came too late
    cmd = [sys.executable, "-m", "rlfleet.cli", "up", "--config", str(CARTPOLE), "--actors", "2",
           "--runs", str(tmp_path), "--max-seconds", "900"]
    launcher = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        fleet_json = wait_for(lambda: next(tmp_path.glob("*/fleet.json"), None), 120, "fleet.json")
        members = json.loads(fleet_json.read_text())["members"]
        if when == "healthy":
            wait_for(lambda: all(scrape(m["url"], health_only=True).healthy for m in members), 180,
                     "every member healthy")
            assert len(tagged(tag)) >= len(members) + 1  # the launcher, its zygotes, every member
        else:  # mid-start: as soon as the first member process exists. Forked members are all healthy
            # within ~0.3 s of the first fork, too short a window to also see one healthy and one not
            # (CI missed it), so the interrupt comes at the first fork, while the launcher is starting the rest
            launcher_and_zygotes = 1 + len(KINDS)
            wait_for(lambda: len(tagged(tag)) > launcher_and_zygotes, 120, "a member process", every_s=0.005)
        os.killpg(launcher.pid, signal.SIGINT)
        out, _ = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(10)
    deadline = time.monotonic() + 10
    while tagged(tag) and time.monotonic() < deadline:  # what could trail the launcher's exit gets 10 s
        time.sleep(0.2)
    return launcher.returncode, out.decode(errors="replace"), tagged(tag)


@pytest.mark.e2e
@pytest.mark.parametrize("when", ["healthy", "starting"])
def test_ctrl_c_leaves_no_process(tmp_path: Path, when: str) -> None:
    code, out, left = run_up_and_interrupt(tmp_path, when)
    assert left == [], f"processes left after Ctrl-C: {left}\n{out[-2000:]}"
    assert code == 0, out[-2000:]
    assert "stopping on SIGINT" in out, out[-2000:]


@pytest.mark.e2e
def test_a_killed_launcher_leaves_no_member_running(tmp_path: Path) -> None:
    """SIGKILL gives the launcher no chance to stop its members (each in a session of its own): they
    see it gone (common/launcher_watch.py) and stop as on SIGTERM, the learner writing its checkpoint."""
    tag = uuid.uuid4().hex
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RLFLEET_TEST_TAG": tag}
    launcher = subprocess.Popen([sys.executable, "-m", "rlfleet.cli", "up", "--config", str(CARTPOLE), "--actors",
                                 "2", "--runs", str(tmp_path), "--max-seconds", "900"], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        fleet_json = wait_for(lambda: next(tmp_path.glob("*/fleet.json"), None), 120, "fleet.json")
        members = json.loads(fleet_json.read_text())["members"]
        wait_for(lambda: all(scrape(m["url"], health_only=True).healthy for m in members), 180,
                 "every member healthy")
        run_dir = fleet_json.parent
        members_and_zygotes = [p for p in tagged(tag) if p != launcher.pid]
        assert len(members_and_zygotes) >= len(members)
        launcher.kill()
        launcher.wait(10)
        wait_for(lambda: not tagged(tag), 60, "every member and fork server gone after the launcher", every_s=0.5)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(10)
        for pid in tagged(tag):  # what the watch missed must not outlive the test
            os.kill(pid, signal.SIGKILL)
    learner_log = (run_dir / "logs" / "learner.log").read_text()
    assert "is gone: stopping as on SIGTERM" in learner_log and "learner shard 0 stopped" in learner_log, \
        learner_log[-2000:]
    assert (run_dir / "learner" / "checkpoint.pt").is_file()


REAP_SCRIPT = r"""
import os, sys, time, subprocess
from pathlib import Path
from rlfleet.cli.forkserver import become_subreaper, reap_orphans

def state(pid):
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return f[0], int(f[1])

def until(cond):
    end = time.monotonic() + 20
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)

assert become_subreaper()
other = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])  # the caller's own child
r, w = os.pipe()
member = os.fork()
if member == 0:  # a member: own session, one child of its own, then killed
    os.setsid()
    grandchild = os.fork()
    if grandchild == 0:
        time.sleep(0.3)
        os._exit(3)
    os.write(w, str(grandchild).encode())
    time.sleep(60)
    os._exit(0)
grandchild = int(os.read(r, 64))
os.kill(member, 9)
os.waitpid(member, 0)  # what ForkedProcess.poll does
until(lambda: state(grandchild) == ("Z", os.getpid()))  # reparented here, exited, not reaped
until(lambda: state(other.pid) is not None and state(other.pid)[0] == "Z")
reaped = reap_orphans({member})
print(reaped == [grandchild], state(grandchild) is None, other.wait(5), reap_orphans({member}))
"""


def test_reap_orphans_reaps_only_members_children() -> None:
    """A killed member's child is reparented to the launcher (subreaper) and left a zombie when it
    exits: reap_orphans reaps it, and leaves alone a child the caller started (its status stays 7)."""
    out = subprocess.run([sys.executable, "-c", REAP_SCRIPT], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "7", "[]"]
