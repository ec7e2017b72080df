"""The `rlfleet up` command: its options, and its fork servers started before anything heavy is imported.

The work itself is cli/launcher.py's :func:`~rlfleet.cli.launcher.run_fleet`. This
module imports only click and cli/forkserver.py (the standard library) at
the top, so the zygotes begin importing torch within ~0.1 s of the command,
while the launcher loads the config and checks the env on the other core.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import click

from rlfleet.cli.forkserver import ForkServers


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="experiment file (YAML); required unless --resume")
@click.option("--resume", "resume", type=click.Path(file_okay=False), default=None, metavar="RUN_DIR",
              help="go on with a stopped run in its directory, with its config (RUN_DIR/config.yaml): checkpoints, "
                   "replay snapshots and the env-step and wall counters continue")
@click.option("--init-from", "init_from", type=click.Path(dir_okay=False), default=None, metavar="CHECKPOINT",
              help="a new run that starts from this checkpoint's weights (weights only: a learner's checkpoint, "
                   "RUN_DIR/evaluator/best.pt or a paramserver shard's .npz)")
@click.option("--actors", type=click.IntRange(min=1), default=None, help="actors to start (default: actor.count)")
@click.option("--planners", type=click.IntRange(min=0), default=None,
              help="planners to start with planning.enabled (default: planning.planners)")
@click.option("--sync", type=click.Choice(["barrier", "async"]), default=None, help="training protocol")
@click.option("--learners", type=click.IntRange(min=1), default=None,
              help="data-parallel learner processes (default: learners in the config)")
@click.option("--until-return", type=float, default=None, help="stop (exit 0) when the eval mean reaches this")
@click.option("--max-seconds", type=float, default=None, help="stop (exit 3 if a target was set) after this long")
@click.option("--max-env-steps", type=int, default=None, help="stop (exit 3 if a target was set) after this many")
@click.option("--inproc", is_flag=True, help="run the whole fleet in this process over inproc:// sockets")
@click.option("--no-fork-server", "no_fork_server", is_flag=True,
              help="start every member as a fresh interpreter (slower; env RLFLEET_FORKSERVER=0 does the same)")
@click.option("--restart", type=click.Choice(["on-failure", "no"]), default="on-failure", show_default=True,
              help="a member that dies mid-run (error exit, killed) is started again, as compose's restart policy "
                   "does; 5 deaths of one member within 300 s end the run")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="override a config field")
@click.option("--seed", type=int, default=None, help="the experiment seed (sets seed)")
@click.option("--env", "env_id", default=None, help="the env to train on (sets env.id)")
@click.option("--runs", "run_root", default="runs", show_default=True, help="where run directories go")
@click.version_option(package_name="rlfleet")
def up(
    config_path: str, actors: int | None, planners: int | None, sync: str | None, learners: int | None,
    until_return: float | None,
    max_seconds: float | None, max_env_steps: int | None, inproc: bool, no_fork_server: bool,
    sets: tuple[str, ...], seed: int | None, env_id: str | None, run_root: str, restart: str,
    resume: str | None = None, init_from: str | None = None,
) -> None:
    """Run the whole fleet on this machine and show its progress."""
    started_at = time.time()  # the run clock counts from here, start-up included
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if (config_path is None) == (resume is None):
        click.echo("rlfleet up: give --config FILE (a new run) or --resume RUN_DIR (a stopped run, with its own "
                   "config), one of them", err=True)
        sys.exit(2)
    if resume is not None:
        config_path = os.path.join(resume, "config.yaml")
        if not os.path.isfile(config_path):
            click.echo(f"rlfleet up: --resume {resume}: {config_path} not found (a run directory of rlfleet up "
                       "holds its config.yaml)", err=True)
            sys.exit(2)
    if resume is not None and init_from is not None:
        click.echo("rlfleet up: --resume goes on with a run's own state; --init-from starts a new run from "
                   "weights: give one of them", err=True)
        sys.exit(2)
    assert config_path is not None
    forkservers = None if inproc or no_fork_server else ForkServers.start_if_enabled()
    try:
        from rlfleet.cli.launcher import EXIT_CONFIG, run_fleet
        from rlfleet.common import config as config_mod
        from rlfleet.common.runtime import LOG_FORMAT

        logging.basicConfig(level="INFO", format=LOG_FORMAT)
        # --actors goes through the config too: checks that depend on the actor count (a PPO barrier
        # round must split into minibatches) then refuse it here, before any run dir or service
        extra = ([f"sync={sync}"] if sync else []) + ([f"actor.count={actors}"] if actors else []) + (
            [f"learners={learners}"] if learners else []) + (
            [f"planning.planners={planners}"] if planners is not None else []) + (
            [f"seed={seed}"] if seed is not None else []) + ([f"env.id={env_id}"] if env_id else [])
        try:
            cfg = config_mod.load(config_path, [*sets, *extra])
        except config_mod.ConfigError as exc:
            click.echo(f"rlfleet: {exc}", err=True)
            sys.exit(EXIT_CONFIG)
        code = run_fleet(cfg, actors or cfg.actor.count, until_return, max_seconds, inproc, run_root,
                         max_env_steps=max_env_steps, forkservers=forkservers, restart=restart,
                         resume=None if resume is None else Path(resume),
                         init_from=None if init_from is None else Path(init_from), started_at=started_at)
    finally:
        if forkservers is not None:
            forkservers.close()
    sys.exit(code)
