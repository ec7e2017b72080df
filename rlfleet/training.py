"""`rlfleet.train`: what `rlfleet up` (or `rlfleet train --serial`) does, called from Python.

The caller's signal handlers and logging are left as they are; a KeyboardInterrupt (Ctrl-C, a
notebook's interrupt) stops the fleet in order and the run comes back with ``ending.how == "stopped"``.
Nothing is printed but a progress line every few seconds, which ``progress=False`` turns off.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlfleet.cli.launcher import EXIT_CONFIG, launch, make_run_dir
from rlfleet.common import config as config_mod
from rlfleet.common.config import Experiment
from rlfleet.runs import Run, read_run

log = logging.getLogger("rlfleet")


class TrainError(ValueError):
    """The run could not start: a config, an override or an env that does not validate; the message
    is the one `rlfleet up` prints."""


def resolve_config(config: str | Path | Experiment, overrides: Mapping[str, Any] | None = None,
                   actors: int | None = None) -> Experiment:
    """The experiment ``config`` (a file, read as `rlfleet up` reads it, RLFLEET_* variables included, or a
    loaded :class:`Experiment`) with ``overrides`` ({"env.id": "CartPole-v1"}: dotted field names, as
    ``--set`` takes them) applied and validated."""
    sets = [f"{key}={json.dumps(value)}" for key, value in (overrides or {}).items()]
    sets += [f"actor.count={actors}"] if actors is not None else []
    try:
        if isinstance(config, Experiment):  # its environment overrides were applied when it was loaded
            return config_mod.load(None, sets, environ={}, data=config.model_dump(mode="json"))
        return config_mod.load(config, sets)
    except config_mod.ConfigError as exc:
        raise TrainError(str(exc)) from None


def train(config: str | Path | Experiment, overrides: Mapping[str, Any] | None = None, *,
          until_return: float | None = None, max_env_steps: int | None = None, max_seconds: float | None = None,
          serial: bool = False, actors: int | None = None, progress: bool = True,
          runs: str | Path = "runs") -> Run:
    """Train ``config`` until an evaluation reaches ``until_return`` or a budget is spent; the finished run.

    ``serial`` runs the serial runner (`rlfleet train --serial`) instead of the fleet (`rlfleet up`);
    ``actors`` sets actor.count; ``runs`` is where the run directory goes. TrainError if it cannot start."""
    started_at = time.time()
    if until_return is None and max_env_steps is None and max_seconds is None:
        raise TrainError("train needs a stopping point: until_return, max_env_steps or max_seconds")
    cfg = resolve_config(config, overrides, actors)
    if serial:
        return _train_serial(cfg, until_return, max_env_steps, max_seconds, progress, str(runs), started_at)
    from rlfleet.cli.forkserver import ForkServers

    errors: list[str] = []

    def say(message: str, is_error: bool) -> None:  # kept for a TrainError, logged for whoever configured logging
        if is_error:
            errors.append(message.removeprefix("rlfleet: "))
        log.info("%s", message)

    forkservers = ForkServers.start_if_enabled()
    try:
        launched = launch(cfg, cfg.actor.count, until_return, max_seconds, False, str(runs), live=False,
                          max_env_steps=max_env_steps, forkservers=forkservers, say=say, handle_signals=False,
                          progress=progress, started_at=started_at)
    finally:
        if forkservers is not None:
            forkservers.close()
    if launched.code == EXIT_CONFIG or launched.run_dir is None:
        raise TrainError("\n".join(errors) or "the run did not start")
    return read_run(launched.run_dir)


def _train_serial(cfg: Experiment, until_return: float | None, max_env_steps: int | None,
                  max_seconds: float | None, progress: bool, runs: str, started_at: float) -> Run:
    from rlfleet.cli.serial import Evaluation, SerialError, check_serial, train_serial

    try:
        check_serial(cfg)
    except SerialError as exc:
        raise TrainError(str(exc)) from None

    def show(e: Evaluation) -> None:
        print(f"[{e.wall_s:5.0f} s] steps {e.env_steps}  weights v{e.version}  eval {e.mean:.1f}", flush=True)

    run_dir = make_run_dir(cfg, runs)
    train_serial(cfg, until_return, max_env_steps, max_seconds, run_dir=run_dir, on_eval=show if progress else None,
                 started_at=started_at)
    return read_run(run_dir)
