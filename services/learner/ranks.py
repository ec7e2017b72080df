"""Several learners: how the ranks of one torch.distributed group find each other, and what each trains on.

``learners: N`` starts N learner processes with the same config; none is told its rank. They meet at
``learner.rendezvous`` (tcp://host:port): one of them listens there (a torch TCPStore), the others
connect, and each takes the next number of a counter in the store as its rank, in the order they
arrived. Who listens: a learner already listening at one of the name's addresses, if any (the
group is forming, or a learner restarted); else, where ``host`` is one address (one machine:
``rlfleet up``), the first learner on that machine to bind the port; where it names several (a
scaled compose service or a Swarm service: one address per learner container), the learner whose
address is the lowest, once the name resolves to all N. A learner never listens for an address
that is not its own, so two machines cannot both host.

Rank 0 publishes weights and writes checkpoints; every rank samples its share of each batch (the
algorithm's ``per_rank_fields`` divided by N) and the ranks' gradients are averaged
(:class:`~rlfleet.common.algorithms.data_parallel.GradientAverager`). All ranks start from the state of the
rank that resumed furthest (``broadcast_learner``): a rank restarted on a host without the newest
checkpoint starts from it too; then rank 0 takes the paramserver's newest weights where the fleet
trained further (``LearnerService.start_from_fleet``) and every rank takes rank 0's state.

With ``network.interface`` set, every rank pins gloo's and NCCL's sockets to that interface
(``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``) before the group forms: on an overlay network
with a gateway bridge beside it they could otherwise pick the wrong one.

The collective backend is gloo on CPU; on CUDA it is ``cpu:gloo,cuda:nccl`` (``learner.backend:
auto`` or ``nccl``): gradients on the GPU go through NCCL, while what is CPU-side (the update counter
and the CPU-copied state of ``broadcast_learner``) goes through gloo in the same group. Each rank
of a CUDA learner trains on its own GPU: ``cuda:LOCAL_RANK`` where the environment says it, else
``cuda:(rank mod the visible devices)``; a device named with its index (``cuda:1``) is kept. Every
wait on the others (joining, each all-reduce) ends after ``learner.collective_timeout_s`` with an
error that names the rendezvous address, so a lost rank stops the others instead of hanging them:
gloo raises in the call; for NCCL, whose errors arrive asynchronously, ``TORCH_NCCL_BLOCKING_WAIT=1``
makes each collective wait for completion and raise within the group's timeout, so it reaches
the same clean error (unless the environment sets it otherwise).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

from rlfleet.common.config import Experiment
from rlfleet.common.netif import pin_collectives
from rlfleet.common.runtime import StartupError

log = logging.getLogger("rlfleet.learner")

RANK_KEY = "rlfleet/rank"
SINGLE_GRACE_S = 20.0  # a DNS name with one address while learners > 1: the others may not be listed yet


@dataclass(frozen=True)
class Group:
    rank: int
    world: int
    backend: str
    address: str
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # what this rank trains on


def per_rank_config(algorithm_cfg: Any, world: int) -> Any:
    """The algorithm's config with each global batch size divided by ``world`` (checked divisible at load)."""
    if world == 1:
        return algorithm_cfg
    fields = {name: getattr(algorithm_cfg, name) // world for name in type(algorithm_cfg).per_rank_fields}
    return algorithm_cfg.model_copy(update=fields)


CUDA_BACKEND = "cpu:gloo,cuda:nccl"  # CUDA tensors through NCCL, CPU tensors through gloo, one group


def backend(cfg: Experiment, device: torch.device) -> str:
    """The process group's backend: gloo on CPU; on CUDA ``cpu:gloo,cuda:nccl`` (auto or nccl), so
    CPU-side collectives have a backend too; nccl asked for without CUDA is refused."""
    wanted = cfg.learner.backend
    if wanted == "nccl" and device.type != "cuda":
        raise StartupError(f"learner.backend=nccl needs CUDA, and this learner trains on {device}; "
                           "allowed here: gloo or auto")
    if wanted == "gloo" or device.type != "cuda":
        return "gloo"
    return CUDA_BACKEND


def local_device(device: torch.device, rank: int, environ: Mapping[str, str], visible: int) -> torch.device:
    """The device this rank trains on: a CUDA device without an index becomes ``cuda:LOCAL_RANK``
    (where ``environ`` sets it) or ``cuda:(rank mod visible)``; anything else stays as it is."""
    if device.type != "cuda" or device.index is not None:
        return device
    if visible < 1:
        raise StartupError(f"learner rank {rank}: device {device} and no CUDA device is visible "
                           f"(CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})")
    text = environ.get("LOCAL_RANK")
    if text is None:
        return torch.device("cuda", rank % visible)
    try:
        index = int(text)
    except ValueError:
        index = -1
    if not 0 <= index < visible:
        raise StartupError(f"learner rank {rank}: LOCAL_RANK={text!r} names no visible CUDA device; allowed: "
                           f"0..{visible - 1} ({visible} visible), or LOCAL_RANK unset (rank mod {visible})")
    return torch.device("cuda", index)


def nccl_environment(environ: MutableMapping[str, str]) -> dict[str, str]:
    """What a rank sets before forming a group with NCCL (what ``environ`` already sets stays): each
    collective waits for completion and raises within the group's timeout, instead of the watchdog
    tearing the process down asynchronously."""
    wanted = {"TORCH_NCCL_BLOCKING_WAIT": "1"}
    added = {key: value for key, value in wanted.items() if key not in environ}
    environ.update(added)
    return added


def join_answering_health(cfg: Experiment, device: torch.device) -> Group:
    """:func:`join`, with /healthz answering "joining" meanwhile on the metrics port: Swarm's DNS
    lists a task only once its health check passes, and the others find this learner by DNS."""
    from rlfleet.common.metrics import MetricsServer, ServiceMetrics

    try:
        http = MetricsServer(ServiceMetrics("learner"), lambda: {"ok": True, "joining": True},
                             cfg.metrics.host, cfg.metrics.port).start()
    except OSError:  # the port is taken: the service's own server will say why
        return join(cfg, device)
    try:
        return join(cfg, device)
    finally:
        http.close()


def join(cfg: Experiment, device: torch.device) -> Group:
    """Meet the other learners at ``learner.rendezvous`` and form the process group."""
    import torch.distributed as dist

    address = cfg.learner.rendezvous
    name, port = address.removeprefix("tcp://").rsplit(":", 1)
    timeout = timedelta(seconds=cfg.learner.collective_timeout_s)
    name_backend = backend(cfg, device)
    host = _host_address(name, int(port), cfg.learners, cfg.learner.collective_timeout_s)
    hosting = False
    if _is_local(host):
        try:  # the first learner here to bind the port hosts; the others connect
            store = dist.TCPStore(host, int(port), None, True, timeout, wait_for_workers=False)
            hosting = True
        except (RuntimeError, OSError):
            pass
    if not hosting:
        try:
            store = dist.TCPStore(host, int(port), None, False, timeout)
        except (RuntimeError, OSError) as exc:
            raise StartupError(f"learner: no rendezvous at {address} (learner.rendezvous) within "
                               f"{cfg.learner.collective_timeout_s:g} s: {exc}") from None
    rank = int(store.add(RANK_KEY, 1)) - 1
    if rank >= cfg.learners:
        raise StartupError(f"learner: {rank + 1} learners met at {address}, the config says learners="
                           f"{cfg.learners}; start at most that many (a rank lost earlier needs the whole group "
                           "restarted)")
    log.info("learner: rank %d of %d at %s (%s)%s; waiting for the others", rank, cfg.learners, address,
             name_backend, ", hosting the rendezvous" if hosting else "")
    pinned = pin_collectives(cfg.network.interface)  # gloo/NCCL on the configured interface, not their guess
    if pinned:
        log.info("learner: collectives on interface %s (%s)", cfg.network.interface, ", ".join(sorted(pinned)))
    here = local_device(device, rank, os.environ, torch.cuda.device_count() if device.type == "cuda" else 0)
    if "nccl" in name_backend:
        nccl_environment(os.environ)
        torch.cuda.set_device(here)  # NCCL's communicator on this rank's own GPU
        log.info("learner: rank %d trains on %s", rank, here)
    try:
        dist.init_process_group(name_backend, store=dist.PrefixStore("rlfleet", store), rank=rank,
                                world_size=cfg.learners, timeout=timeout)
        dist.barrier()
    except (RuntimeError, OSError) as exc:
        raise StartupError(f"learner rank {rank}: the group of {cfg.learners} at {address} (learner.rendezvous) "
                           f"did not form within {cfg.learner.collective_timeout_s:g} s: {exc}") from None
    # keep the store alive as long as the group: the hosting rank's object serves it
    _stores.append(store)
    return Group(rank, cfg.learners, name_backend, address, here)


def _host_address(name: str, port: int, learners: int, timeout_s: float) -> str:
    """The address whose learner hosts. A learner already listening at one of ``name``'s addresses
    (the group is forming, or one restarted) wins; else the lowest address once ``name`` resolves
    to one per learner; an IP literal or a name that keeps one address for ``SINGLE_GRACE_S`` is a
    machine's own (one machine: ``rlfleet up``; or a fixed host)."""
    literal = _is_ip(name) or name == "localhost"
    start = time.monotonic()
    while True:
        try:
            found = sorted({str(info[4][0]) for info in socket.getaddrinfo(name, None, socket.AF_INET)},
                           key=ipaddress.ip_address)
        except socket.gaierror:
            found = []
        listening = next((ip for ip in found if _listening(ip, port)), None)
        if listening is not None:
            return listening
        waited = time.monotonic() - start
        if len(found) >= learners or (len(found) == 1 and (literal or waited >= SINGLE_GRACE_S)):
            return found[0]
        if waited >= timeout_s:
            raise StartupError(f"learner: {name} (learner.rendezvous) resolves to {found or 'nothing'}; waited "
                               f"{timeout_s:g} s for one address, or one per learner (learners={learners})")
        time.sleep(0.5)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _listening(ip: str, port: int) -> bool:
    """Whether something accepts connections at ip:port (a rendezvous already hosted there)."""
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


def _is_local(ip: str) -> bool:
    """Whether this machine (container) owns ``ip``: only then may it listen for it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
        except OSError:
            return False
    return True


_stores: list[Any] = []


def leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _stores.clear()
