"""Secure by default off loopback: a server refuses to serve plain ZeroMQ beyond its host unless told to.

replay and paramserver take inserts, samples, weights and gradients from whoever connects. Without
CurveZMQ (``security.mode: curve``, keys from ``rlfleet keys``) anyone who can reach the port can
insert, read and overwrite weights, so a server whose bind address is not loopback (``*`` and
``0.0.0.0`` are every interface, so not loopback) does not start unless ``security.insecure: true``
says plain TCP there is meant (a private network, a test). Loopback addresses (127.0.0.0/8, ::1,
``localhost``, the interface ``lo``), ``ipc://`` and ``inproc://`` serve only this host and need
neither. The metrics and health HTTP ports are not ZeroMQ and are not affected (``metrics.host``).
"""

from __future__ import annotations

import ipaddress

from rlfleet.common.config import ConfigError, Experiment

LOOPBACK_NAMES = frozenset({"localhost", "lo"})


def is_loopback(bind: str) -> bool:
    """Whether a ZeroMQ bind address serves this host only."""
    if not bind.startswith("tcp://"):
        return bind.startswith(("ipc://", "inproc://"))
    host = bind.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "*", an interface name or a host name: beyond this host
        return False


def refuse_plain_exposure(cfg: Experiment, server: str, bind: str, encrypted: bool) -> None:
    """ConfigError when ``server`` would bind ``bind`` beyond this host with plain ZeroMQ and the config did
    not say ``security.insecure: true``; the message says how to make keys."""
    if encrypted or cfg.security.insecure or is_loopback(bind):
        return
    raise ConfigError(
        f"{server} would serve {bind} (network.bind_host={cfg.network.bind_host!r}) with no encryption: anyone "
        "who reaches this host could insert, sample and overwrite weights. Make keys with `rlfleet keys --dir "
        "keys` and set security.mode=curve (docs/operations.md, Security); or bind loopback only "
        "(network.bind_host=127.0.0.1); or set security.insecure=true to serve plain TCP on a network you trust")
