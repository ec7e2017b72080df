"""CurveZMQ keys: making them (`rlfleet keys`), reading them for a service, and the
throwaway set `rlfleet up` makes when a run asks for curve without keys.

Key files are ZeroMQ certificates, the format ``zmq.auth`` reads and writes
(``zmq.auth.load_certificate``), so any ZeroMQ tool can use them::

    KEYS/server.key            servers' public key            -> every host
    KEYS/server.key_secret     servers' key pair (0600)       -> replay and paramserver hosts
    KEYS/clients/NAME.key      a client's public key          -> replay and paramserver hosts (the allowlist)
    KEYS/NAME.key_secret       client NAME's key pair (0600)  -> the hosts that run NAME

One key pair serves every replay and paramserver shard; each client role
(learner, actor, evaluator, or any name) has its own pair, and a server
accepts exactly the public keys in its allowlist directory.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from rlfleet.common.config import ConfigError, Experiment, SecurityConfig, validate
from rlfleet.common.roles import CLIENTS
from rlfleet.common.wire.transport import CurveConfig, fingerprint

log = logging.getLogger(__name__)

SERVER = "server"
CLIENTS_DIR = "clients"
DEFAULT_CLIENTS = CLIENTS  # every client role: learner, actor, evaluator
PUBLIC, SECRET = ".key", ".key_secret"

_BANNER = """#   ****  Generated on {now} by rlfleet keys  ****
#   ZeroMQ CURVE {what} Certificate ({name})
#   {advice}

metadata
curve
"""


@dataclass(frozen=True)
class KeyFile:
    """One file `rlfleet keys` wrote."""

    path: Path
    name: str
    secret: bool
    fingerprint: str


def _write(path: Path, name: str, public: bytes, secret: bytes | None, force: bool) -> KeyFile:
    what, advice = ("Secret", "Keep this file on the hosts that need it, mode 0600; never share it.") if secret \
        else ("Public", "Copy freely: a public key identifies, it does not authorize.")
    text = _BANNER.format(now=datetime.datetime.now().isoformat(timespec="seconds"), what=what, name=name,
                          advice=advice)
    text += f'    public-key = "{public.decode()}"\n'
    if secret is not None:
        text += f'    secret-key = "{secret.decode()}"\n'
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    # Created 0600 (not chmod-ed afterwards): a secret is never readable by others, not even briefly.
    fd = os.open(path, flags, 0o600 if secret is not None else 0o644)
    with os.fdopen(fd, "w") as f:
        if secret is not None:
            os.fchmod(f.fileno(), 0o600)  # an overwritten file keeps its old mode otherwise
        f.write(text)
    return KeyFile(path, name, secret is not None, fingerprint(public))


def make_keys(directory: str | Path, clients: tuple[str, ...] = DEFAULT_CLIENTS, *, server: bool = True,
              force: bool = False) -> list[KeyFile]:
    """Write a server key pair (unless ``server`` is False) and one pair per client name.

    Refuses (FileExistsError naming every file) to overwrite a key unless ``force``.
    """
    bad = [c for c in clients if not c or "/" in c or c.startswith(".") or c == SERVER]
    if bad:
        raise ValueError(f"client names {bad} are not allowed: a name is a file name, not '{SERVER}'")
    root = Path(directory)
    plan: list[tuple[Path, Path, str]] = []  # (public file, secret file, name)
    if server:
        plan.append((root / f"{SERVER}{PUBLIC}", root / f"{SERVER}{SECRET}", SERVER))
    plan += [(root / CLIENTS_DIR / f"{c}{PUBLIC}", root / f"{c}{SECRET}", c) for c in dict.fromkeys(clients)]
    existing = [str(p) for pair in plan for p in pair[:2] if p.exists()]
    if existing and not force:
        raise FileExistsError(f"keys exist already: {', '.join(existing)} (--force replaces them)")
    (root / CLIENTS_DIR).mkdir(parents=True, exist_ok=True)
    out = []
    for public_path, secret_path, name in plan:
        public, secret = zmq.curve_keypair()
        out.append(_write(secret_path, name, public, secret, force))
        out.append(_write(public_path, name, public, None, force))
    return out


# -- reading keys for a service ----------------------------------------------------


def paths(sec: SecurityConfig, role: str) -> dict[str, Path]:
    """The files the config names for ``role`` (a client name), defaults filled in."""
    root = Path(sec.keys_dir)
    return {
        "server_key": Path(sec.server_key) if sec.server_key else root / f"{SERVER}{PUBLIC}",
        "server_secret_key": Path(sec.server_secret_key) if sec.server_secret_key else root / f"{SERVER}{SECRET}",
        "allowed_clients": Path(sec.allowed_clients) if sec.allowed_clients else root / CLIENTS_DIR,
        "client_key": Path(sec.client_key) if sec.client_key else root / f"{role}{SECRET}",
    }


def _problem(field: str, path: Path, what: str) -> ConfigError:
    return ConfigError(f"security.{field} = {str(path)!r}: {what} (security.mode=curve; "
                       f"make keys with 'rlfleet keys --dir {path.parent}')")


def _valid_key(key: bytes) -> bool:
    if len(key) != 40:
        return False
    try:
        return len(z85.decode(key)) == 32
    except (ValueError, KeyError, TypeError):
        return False


def load_key(path: Path, field: str, secret: bool) -> tuple[bytes, bytes | None]:
    """(public, secret) from a ZeroMQ certificate; ConfigError naming ``field`` if it cannot serve."""
    if not path.is_file():
        raise _problem(field, path, "no such file" if not path.exists() else "not a file")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise _problem(field, path, f"not a ZeroMQ certificate ({exc})") from None
    if not _valid_key(public):
        raise _problem(field, path, "public-key is not a 40-character z85 CurveZMQ key")
    if secret:
        if secret_key is None:
            raise _problem(field, path, f"holds no secret-key (a public {PUBLIC} file where a {SECRET} is needed?)")
        if not _valid_key(secret_key):
            raise _problem(field, path, "secret-key is not a 40-character z85 CurveZMQ key")
        if zmq.curve_public(secret_key) != public:
            raise _problem(field, path, "public-key does not belong to its secret-key")
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            log.warning("security.%s: %s is readable by others (mode %o); chmod 600 it", field, path, mode)
    return public, secret_key


def load_allowlist(path: Path) -> list[bytes]:
    """Every public key in the allowlist directory (``*.key``)."""
    if not path.is_dir():
        raise _problem("allowed_clients", path, "no such directory" if not path.exists() else "not a directory")
    keys = [load_key(f, "allowed_clients", secret=False)[0] for f in sorted(path.glob(f"*{PUBLIC}"))]
    if not keys:
        raise _problem("allowed_clients", path, f"holds no {PUBLIC} file: no client could connect")
    return keys


def server_curve(cfg: Experiment) -> CurveConfig | None:
    """What a replay or paramserver shard binds with; None when security.mode is none."""
    if cfg.security.mode != "curve":
        return None
    p = paths(cfg.security, SERVER)
    public, secret = load_key(p["server_secret_key"], "server_secret_key", secret=True)
    assert secret is not None
    return CurveConfig(public_key=public, secret_key=secret, allowed_clients=load_allowlist(p["allowed_clients"]))


def client_curve(cfg: Experiment, role: str) -> CurveConfig | None:
    """What client ``role`` (learner, actor, evaluator) connects with; None when security.mode is none."""
    if cfg.security.mode != "curve":
        return None
    p = paths(cfg.security, role)
    server_key = load_key(p["server_key"], "server_key", secret=False)[0]
    public, secret = load_key(p["client_key"], "client_key", secret=True)
    assert secret is not None
    return CurveConfig(public_key=public, secret_key=secret, server_key=server_key)


def refused_hint(cfg: Experiment, role: str) -> str:
    """What to add to "the server did not answer" under curve: a refused key looks the same to a client."""
    if cfg.security.mode != "curve":
        return ""
    path = paths(cfg.security, role)["client_key"]
    try:
        fp = fingerprint(load_key(path, "client_key", secret=True)[0])
    except ConfigError:
        fp = "unreadable"
    return (f"; with security.mode=curve a server that refuses this client looks the same: is {path} "
            f"(fingerprint {fp}) in the servers' allowlist (security.allowed_clients), and "
            f"security.server_key the servers' public key?")


def check(cfg: Experiment, roles: tuple[str, ...] | None = None, server: bool = True) -> None:
    """Load every key a fleet of these roles (default: this experiment's, :func:`fleet_roles`) needs
    (ConfigError on the first problem)."""
    if server:
        server_curve(cfg)
    for role in fleet_roles(cfg) if roles is None else roles:
        client_curve(cfg, role)


def local_keys(cfg: Experiment, run_dir: Path) -> tuple[Experiment, list[KeyFile]]:
    """Keys for a fleet on this host (`rlfleet up`).

    Configured keys are used when they exist; when none of the files exists, a
    throwaway set is made in RUN_DIR/keys (a local fleet needs no key to leave
    the host). Some but not all present is a mistake, reported as ConfigError.
    """
    if cfg.security.mode != "curve":
        return cfg, []
    roles = fleet_roles(cfg)
    wanted = [p for role in roles for p in paths(cfg.security, role).values()]
    if any(p.exists() for p in wanted):
        check(cfg, roles)
        return cfg, []
    keys_dir = (run_dir / "keys").resolve()
    written = make_keys(keys_dir, roles)
    data = cfg.model_dump(mode="json")
    data["security"] = {"mode": "curve", "keys_dir": str(keys_dir)}
    return validate(data), written


def fleet_roles(cfg: Experiment) -> tuple[str, ...]:
    """The client roles of a local fleet."""
    wanted = {"evaluator": cfg.evaluator.enabled, "modeler": cfg.planning.enabled, "planner": cfg.planning.enabled}
    return tuple(name for name in CLIENTS if wanted.get(name, True))
