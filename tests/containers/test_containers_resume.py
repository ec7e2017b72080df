"""What the images and the compose file promise about stopping, checked on real containers.

- Each service runs as PID 1 of its container, as uid 10001 (the image's ``rlfleet`` user), so
  ``docker stop``'s SIGTERM reaches the service itself, and the learner writes its checkpoint then.
- ``docker compose down`` (without ``-v``) and ``up`` again resume: the learner from its checkpoint,
  replay from its snapshot (both on named volumes), and their counters go on from where they were.

Needs a Docker engine and the images (`make images`); in CI a missing engine fails the run.
"""

from __future__ import annotations

import io
import re
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from harness.docker_fleet import SHORT_ENV, ComposeProject, compose_project, healthz, wait_for
from rlfleet.common.algorithms.checkpoint import load_checkpoint

pytestmark = pytest.mark.container

STARTUP_S = 300  # torch imported in four containers at once on a loaded 2-core machine
SERVICES = ("replay", "paramserver", "learner", "actor")
CHECKPOINT = "/var/lib/rlfleet/run/learner/checkpoint.pt"
# no periodic checkpoint within the test: the one found after `docker stop` is the stop's
ENV = {**SHORT_ENV, "RLFLEET_LEARNER__CHECKPOINT_EVERY_S": "86400"}


def proc1_status(container: Any) -> dict[str, str]:
    """/proc/1/status of the container, by field."""
    code, out = container.exec_run(["cat", "/proc/1/status"])
    assert code == 0, out
    return dict(line.split(":\t", 1) for line in out.decode().splitlines() if ":\t" in line)


def proc1_cmdline(container: Any) -> list[str]:
    code, out = container.exec_run(["cat", "/proc/1/cmdline"])
    assert code == 0, out
    return out.decode().rstrip("\0").split("\0")


def copy_out(container: Any, path: str, to: Path) -> tuple[Path, float]:
    """``path`` from the container (running or stopped) into directory ``to``; (local path, its mtime)."""
    stream, _ = container.get_archive(path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.getmember(Path(path).name)
        tar.extractall(to, filter="data")
    return to / member.name, float(member.mtime)


def training(proj: ComposeProject, updates: int) -> dict[str, Any]:
    """The learner's /healthz once it has made ``updates`` updates and published a version."""
    learner = wait_for(lambda: proj.one("learner"), bool, STARTUP_S, "a running learner")
    return wait_for(lambda: healthz(learner), lambda h: h["updates"] >= updates and h["version"] >= 1, STARTUP_S,
                    f"{updates} learner updates and a published version")


def test_each_service_is_pid_1_as_uid_10001_and_sigterm_checkpoints_the_learner(docker_client: Any,
                                                                                   tmp_path: Path) -> None:
    with compose_project(docker_client, tmp_path, ENV, actors=1, services=SERVICES) as proj:
        before = training(proj, 1)
        for service in SERVICES:
            container = proj.one(service)
            status, cmdline = proc1_status(container), proc1_cmdline(container)
            assert status["Uid"].split() == ["10001"] * 4, (service, status["Uid"])  # real, effective, saved, fs
            assert status["Gid"].split() == ["10001"] * 4, (service, status["Gid"])
            assert cmdline[:3] == ["python", "-m", "rlfleet.cli"] and cmdline[3:5] == ["service", service], \
                (service, cmdline)
            top = container.top(ps_args="-o pid,user,args")
            assert [p[0] for p in top["Processes"] if "cli service" in p[-1]] and \
                all(p[1] in ("10001", "rlfleet") for p in top["Processes"]), (service, top)
        learner = proj.one("learner")
        with pytest.raises(Exception, match="(?i)not found|no such"):
            learner.get_archive(CHECKPOINT)  # none yet: the periodic one is a day away
        stopped_at = time.time()
        learner.stop(timeout=30)  # SIGTERM to PID 1; SIGKILL only after 30 s
        learner.reload()
        assert learner.attrs["State"]["ExitCode"] == 0, learner.logs(tail=20).decode(errors="replace")
        path, mtime = copy_out(learner, CHECKPOINT, tmp_path)
        assert mtime >= stopped_at - 2  # written by the stop (the container's clock is the host's)
        state = load_checkpoint(path)
        assert state is not None
        assert state["core"]["num_updates"] >= before["updates"] > 0
        assert state["version"] >= before["version"] >= 1
        assert "learner: checkpoint at update" in learner.logs(tail=50).decode(errors="replace")


def logged(container: Any, pattern: str) -> re.Match[str] | None:
    return re.search(pattern, container.logs().decode(errors="replace"))


def test_compose_down_and_up_resume_from_the_checkpoint_and_the_snapshot(docker_client: Any,
                                                                         tmp_path: Path) -> None:
    with compose_project(docker_client, tmp_path, SHORT_ENV, actors=1, services=SERVICES) as proj:
        before = training(proj, 50)
        size = healthz(proj.one("replay"))["tables"]["main"]
        assert size >= 200  # at least the min size: the learner trains
        proj.down(volumes=False)  # SIGTERM: the learner checkpoints, replay snapshots; the volumes stay
        assert proj.containers(all=True) == []
        proj.up(1, *SERVICES)
        learner = wait_for(lambda: proj.one("learner"), bool, STARTUP_S, "the learner up again")
        resumed = wait_for(lambda: logged(learner, r"resumed from \S+ at update (\d+), version (\d+)"), bool,
                           STARTUP_S, "the learner resumed from its checkpoint")
        assert resumed is not None
        assert int(resumed[1]) >= before["updates"] and int(resumed[2]) >= before["version"]
        after = wait_for(lambda: healthz(learner), lambda h: h["updates"] >= int(resumed[1]), STARTUP_S,
                         "the learner's healthz")
        assert after["version"] >= before["version"]  # versions go on, never back to 0
        replay = proj.one("replay")
        restored = wait_for(lambda: logged(replay, r"restored (\d+) items"), bool, STARTUP_S,
                            "replay restored its snapshot")
        assert restored is not None and int(restored[1]) >= size
        assert healthz(replay)["tables"]["main"] >= size
