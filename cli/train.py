"""`rlfleet train --serial CONFIG`: the algorithm alone, in this process (cli/serial.py)."""

from __future__ import annotations

import logging
import sys
import time

import click

EXIT_TARGET, EXIT_BUDGET, EXIT_CONFIG = 0, 3, 2


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), required=True,
              help="experiment file (YAML)")
@click.option("--serial", is_flag=True, required=True,
              help="run the algorithm in one process, no services (the only mode of this command so far)")
@click.option("--until-return", type=float, default=None, help="stop (exit 0) when the eval mean reaches this")
@click.option("--max-seconds", type=float, default=None, help="stop (exit 3 if a target was set) after this long")
@click.option("--max-env-steps", type=int, default=None, help="stop (exit 3 if a target was set) after this many")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="override a config field")
@click.option("--seed", type=int, default=None, help="the experiment seed (sets seed)")
@click.option("--env", "env_id", default=None, help="the env to train on (sets env.id)")
@click.option("--runs", "run_root", default="runs", show_default=True, help="where run directories go")
@click.version_option(package_name="rlfleet")
def train(config_path: str, serial: bool, until_return: float | None, max_seconds: float | None,
          max_env_steps: int | None, sets: tuple[str, ...], seed: int | None, env_id: str | None,
          run_root: str) -> None:
    """Train with the serial runner: the fleet's algorithm objects in one loop, no sockets."""
    started_at = time.time()
    from rlfleet.cli.launcher import make_run_dir
    from rlfleet.cli.serial import SerialError, check_serial, train_serial
    from rlfleet.common import config as config_mod
    from rlfleet.common.runtime import LOG_FORMAT

    logging.basicConfig(level="INFO", format=LOG_FORMAT)
    try:
        extra = ([f"seed={seed}"] if seed is not None else []) + ([f"env.id={env_id}"] if env_id else [])
        cfg = config_mod.load(config_path, [*sets, *extra])
    except config_mod.ConfigError as exc:
        click.echo(f"rlfleet: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    if until_return is None and max_env_steps is None and max_seconds is None:
        click.echo("rlfleet: train needs a stopping point: --until-return, --max-env-steps or --max-seconds",
                   err=True)
        sys.exit(EXIT_CONFIG)
    try:
        check_serial(cfg)
    except SerialError as exc:
        click.echo(f"rlfleet: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    run_dir = make_run_dir(cfg, run_root)
    result = train_serial(cfg, until_return, max_env_steps, max_seconds, run_dir=run_dir, started_at=started_at)
    best = "-" if result.best is None else f"{result.best:.1f}"
    click.echo(f"{run_dir}: {'solved' if result.solved else 'not solved'} after {result.env_steps} env steps, "
               f"{result.updates} updates, {result.wall_s:.1f} s; best evaluation {best}")
    sys.exit(EXIT_TARGET if result.solved or until_return is None else EXIT_BUDGET)
