"""``network.interface``: one network interface for the fleet's traffic, said out loud.

On a host with several interfaces (an overlay network with a gateway bridge beside it, a
management and a data network) gloo and NCCL pick one by themselves and can pick the wrong one.
Named in ``network.interface``, the interface gives replay and paramserver their ZeroMQ bind
address (its IPv4 address, instead of ``network.bind_host``) and the learner ranks their
``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``. Linux only (the address comes from the
SIOCGIFADDR ioctl); an interface this host does not have is a clear error naming those it has.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

from rlfleet.common.config import ConfigError

SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
COLLECTIVE_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def interface_address(name: str) -> str:
    """The IPv4 address of interface ``name`` on this host; ConfigError if it has none or does not exist."""
    names = sorted(n for _, n in socket.if_nameindex())
    if name not in names:
        raise ConfigError(f"network.interface={name!r}: this host has no such interface; allowed: {names}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        except OSError as exc:
            raise ConfigError(f"network.interface={name!r} has no IPv4 address ({exc.strerror}); the fleet's "
                              "ZeroMQ sockets and collectives need one") from None
    return socket.inet_ntoa(packed[20:24])


def pin_collectives(name: str | None) -> dict[str, str]:
    """Set gloo's and NCCL's socket interface to ``name`` in this process's environment (before the
    process group forms); returns what it set (nothing for None: they choose by themselves)."""
    if name is None:
        return {}
    interface_address(name)  # exists, with an address: else the group would fail later, less clearly
    pinned = dict.fromkeys(COLLECTIVE_ENV, name)
    os.environ.update(pinned)
    return pinned
