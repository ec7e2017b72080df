"""The `rlfleet` command: run the fleet locally, run one service, inspect a config.

`rlfleet service` and `rlfleet config` are here; the other commands each live in a module of their own
(:attr:`LazyGroup.LAZY`)."""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

import click

from rlfleet.common.roles import NAMES

if TYPE_CHECKING:
    from rlfleet.common.config import Experiment

SERVICE_NAMES = tuple(sorted(NAMES))

CONFIG_HELP = "experiment file (YAML); RLFLEET_* env vars and --set override it"


def load_or_exit(path: str | None, sets: tuple[str, ...]) -> Experiment:
    from rlfleet.common import config as config_mod

    try:
        return config_mod.load(path, sets)
    except config_mod.ConfigError as exc:
        click.echo(f"rlfleet: {exc}", err=True)
        sys.exit(2)


class LazyGroup(click.Group):
    """Subcommands imported when they run: `rlfleet service replay` never imports torch or gymnasium,
    and `rlfleet up` starts its fork servers before it imports what the launcher needs."""

    LAZY = {"up": ("rlfleet.cli.up", "up"), "report": ("rlfleet.cli.report", "report"),
            "eval": ("rlfleet.cli.evaluate", "eval_checkpoint"), "status": ("rlfleet.cli.status", "status"),
            "keys": ("rlfleet.cli.keys", "keys"), "train": ("rlfleet.cli.train", "train"),
            "stack": ("rlfleet.cli.stack", "stack")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY:
            module, attr = self.LAZY[cmd_name]
            command = getattr(importlib.import_module(module), attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rlfleet")
def main() -> None:
    """rlfleet: distributed deep RL as ZeroMQ microservices."""
    caller_dir_on_path()


def caller_dir_on_path() -> None:
    """The directory the command runs in goes on sys.path (as `python -m` puts it), so an env.id or
    env.imports module there imports in every command and every service it starts (they inherit it).
    Appended: a folder there named like one of rlfleet's packages does not shadow it."""
    import os

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


@main.command()
@click.argument("name", type=click.Choice(SERVICE_NAMES))
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

    from rlfleet.cli.dispatch import run
    from rlfleet.common.runtime import ServiceArgs, setup_logging

    setup_logging(log_level)
    cfg = load_or_exit(config_path, sets)
    if shard is None:
        shard = int(os.environ.get("RLFLEET_SHARD", "0"))
    actor_id = actor_id or os.environ.get("RLFLEET_ACTOR_ID")
    sys.exit(run(cfg, ServiceArgs(name=name, shard=shard, actor_id=actor_id)))


@main.command("check-env", hidden=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help=CONFIG_HELP)
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="override a config field")
def check_env(config_path: str | None, sets: tuple[str, ...]) -> None:
    """Make the configured env once and check that it fits the algorithm; exit 2 with the reason if not.

    What `rlfleet up` runs first, in a process forked by its heavy fork server (torch is already
    imported there), so that the launcher itself never imports torch."""
    probe_or_exit(load_or_exit(config_path, sets))


def probe_or_exit(cfg: Experiment) -> None:
    """Make the configured env once (common.envs.probe_env); exit 2 with the reason if it does not fit."""
    from rlfleet.common.envs import EnvError, probe_env

    try:
        probe_env(cfg)
    except EnvError as exc:
        click.echo(f"rlfleet: {exc}", err=True)
        sys.exit(2)


@main.command("config")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help=CONFIG_HELP)
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="override a config field")
@click.option("--explain", "explain", is_flag=False, flag_value="", default=None, metavar="[FIELD]",
              help="print each field's description, default and allowed values (a field or section: only those)")
def show_config(config_path: str | None, sets: tuple[str, ...], explain: str | None) -> None:
    """Validate an experiment as `rlfleet up` does (its env made once) and print it resolved (file + env +
    --set); or, with --explain, what its fields mean."""
    from rlfleet.common import config as config_mod

    if explain is not None:
        from rlfleet.common.config.explain import UnknownField
        from rlfleet.common.config.explain import explain as explain_fields

        try:
            click.echo("\n\n".join(d.text() for d in explain_fields(explain or None)))
        except UnknownField as exc:
            click.echo(f"rlfleet: {exc}", err=True)
            sys.exit(2)
        return
    cfg = load_or_exit(config_path, sets)
    probe_or_exit(cfg)
    click.echo(config_mod.dump(cfg), nl=False)


if __name__ == "__main__":
    main()
