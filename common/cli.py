"""The `rlfleet` command: run the fleet locally, run one service, inspect a config."""

from __future__ import annotations

import sys

import click

from common import config as config_mod
from common.evalcmd import eval_checkpoint
from common.launcher import up
from common.report import report
from common.runtime import SERVICES, ServiceArgs, run_service, setup_logging
from common.status import status

CONFIG_HELP = "experiment file (YAML); RLFLEET_* env vars and --set override it"


def load_or_exit(path: str | None, sets: tuple[str, ...]) -> config_mod.Experiment:
    try:
        return config_mod.load(path, sets)
    except config_mod.ConfigError as exc:
        click.echo(f"rlfleet: {exc}", err=True)
        sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """rlfleet: distributed deep RL as ZeroMQ microservices."""


@main.command()
@click.argument("name", type=click.Choice(sorted(SERVICES)))
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help=CONFIG_HELP)
@click.option("--shard", type=int, default=None, help="shard index (replay, paramserver); env RLFLEET_SHARD")
@click.option("--actor-id", default=None, help="stable actor id (default: hostname-pid); env RLFLEET_ACTOR_ID")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="override a config field")
@click.option("--log-level", default="INFO", show_default=True)
def service(
    name: str, config_path: str | None, shard: int | None, actor_id: str | None, sets: tuple[str, ...],
    log_level: str,
) -> None:
    """Run one service in the foreground (what a container runs)."""
    import os

    setup_logging(log_level)
    cfg = load_or_exit(config_path, sets)
    if shard is None:
        shard = int(os.environ.get("RLFLEET_SHARD", "0"))
    actor_id = actor_id or os.environ.get("RLFLEET_ACTOR_ID")
    sys.exit(run_service(cfg, ServiceArgs(name=name, shard=shard, actor_id=actor_id)))


@main.command("config")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help=CONFIG_HELP)
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="override a config field")
def show_config(config_path: str | None, sets: tuple[str, ...]) -> None:
    """Validate an experiment and print it resolved (file + env + --set)."""
    click.echo(config_mod.dump(load_or_exit(config_path, sets)), nl=False)


@main.command()
@click.option("--dir", "directory", default="keys", show_default=True, type=click.Path(file_okay=False),
              help="where the keys go (the config's security.keys_dir)")
@click.option("--client", "clients", multiple=True, metavar="NAME",
              help="a client key pair to make (repeatable; default: learner, actor, evaluator)")
@click.option("--no-server", is_flag=True, help="only client pairs: add clients to an existing set")
@click.option("--force", is_flag=True, help="replace keys that exist")
def keys(directory: str, clients: tuple[str, ...], no_server: bool, force: bool) -> None:
    """Make CurveZMQ key pairs for security.mode=curve (ZeroMQ certificate files)."""
    from pathlib import Path

    from common import security

    try:
        written = security.make_keys(directory, clients or security.DEFAULT_CLIENTS, server=not no_server,
                                     force=force)
    except (FileExistsError, ValueError) as exc:
        click.echo(f"rlfleet keys: {exc}", err=True)
        sys.exit(2)
    where = {True: "secret, mode 0600", False: "public"}
    width = max(len(str(k.path)) for k in written)
    for k in written:
        click.echo(f"{str(k.path):<{width}}  {k.name:<12} {where[k.secret]:<17}  fingerprint {k.fingerprint}")
    root = Path(directory)
    click.echo(
        f"\ncopy to replay and paramserver hosts: {root / 'server.key_secret'}, {root / 'clients'}/\n"
        f"copy to every client host: {root / 'server.key'} and that client's NAME.key_secret\n"
        f"then run with security.mode=curve and security.keys_dir={directory} (see README, Security)"
    )


main.add_command(up)
main.add_command(report)
main.add_command(eval_checkpoint)
main.add_command(status)

if __name__ == "__main__":
    main()
