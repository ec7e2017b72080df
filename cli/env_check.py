"""Before a fleet starts: can the configured env be made, and does it fit the algorithm?"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import tempfile
from pathlib import Path

from rlfleet.cli.forkserver import ForkServerError, ForkServers
from rlfleet.common import config as config_mod
from rlfleet.common.config import Experiment
from rlfleet.common.envs import EnvError, probe_env

log = logging.getLogger("rlfleet.up")


def check_env(cfg: Experiment, forkservers: ForkServers | None, timeout_s: float = 120.0) -> None:
    """Raise EnvError if the configured env cannot be made or does not fit the algorithm.

    The check imports the algorithm (torch): with fork servers it runs in a process forked by the heavy
    one, where torch is already imported, instead of costing the launcher ~2 s of CPU on the cores the
    fleet is starting on."""
    if forkservers is not None:
        with tempfile.TemporaryDirectory(prefix="rlfleet-check-") as tmp:
            path, out = Path(tmp) / "config.yaml", Path(tmp) / "check.log"
            path.write_text(config_mod.dump(cfg))
            proc = None
            try:
                proc = forkservers.fork("learner", ["check-env", "--config", str(path)], out)
                code = proc.wait(timeout_s)
            except (ForkServerError, subprocess.TimeoutExpired) as exc:
                if proc is not None:  # timed out: it must not outlive its config file
                    proc.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(5)
                log.warning("env check in the fork server failed (%s); checking here", exc)
            else:
                if code == 0:
                    return
                text = out.read_text(errors="replace")
                if code == 2 and "rlfleet: " in text:
                    raise EnvError(text.split("rlfleet: ", 1)[1].strip())
                log.warning("env check in the fork server exited %s; checking here:\n%s", code, text[-2000:])
    probe_env(cfg)
