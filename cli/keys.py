"""`rlfleet keys`: make the CurveZMQ key pairs a fleet with security.mode=curve needs (common/security.py
writes them)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from rlfleet.common import security
from rlfleet.common.roles import CLIENTS


@click.command()
@click.option("--dir", "directory", default="keys", show_default=True, type=click.Path(file_okay=False),
              help="where the keys go (the config's security.keys_dir)")
@click.option("--client", "clients", multiple=True, metavar="NAME",
              help=f"a client key pair to make (repeatable; default: {', '.join(CLIENTS)})")
@click.option("--no-server", is_flag=True, help="only client pairs: add clients to an existing set")
@click.option("--force", is_flag=True, help="replace keys that exist")
def keys(directory: str, clients: tuple[str, ...], no_server: bool, force: bool) -> None:
    """Make CurveZMQ key pairs for security.mode=curve (ZeroMQ certificate files)."""
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
