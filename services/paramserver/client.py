"""Clients of the parameter server: publish weights, read them, register, barrier.

- :class:`WeightsPublisher` (learner): ``publish(version, tensors)`` sends each
  shard its slice in parallel and returns once every shard acked;
  ``barrier(round)`` blocks until every live actor waits for round + 1.
- :class:`WeightsReader` (actors, evaluators): ``get`` polls, ``wait`` long
  polls; both return one consistent version, the newest that every shard
  holds, assembled from pieces that all carry that version and the same
  layout. Tensors come back as read-only views of the received frames.
- :class:`RegistryClient` (actors): hello / heartbeat / goodbye on shard 0.

Every call takes a timeout and raises :class:`CommTimeout` when it passes;
an ``error`` reply raises :class:`RemoteError` with the server's reason.
A reader that takes part in the barrier must use its ``actor_id`` as
``sender``: that is how shard 0 knows which actor a parked ``wait`` is from.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from common.partition import Layout, fingerprint, tensor_specs
from common.protocol import DEFAULT_LIMITS, Limits, Message, ProtocolError, decode
from common.server import Client, CommTimeout, RemoteError
from common.transport import CurveConfig
from services.paramserver import shm as shmlib

log = logging.getLogger(__name__)

Weights = tuple[int, dict[str, np.ndarray]]

#: extra time a client waits beyond a long poll's own timeout before giving up on the server
WAIT_MARGIN_S = 1.0
#: error reasons after which a reader that asked for shared memory asks that shard again with frames
SHM_FALLBACK_REASONS = frozenset({"internal"})


class _Shards:
    """One DEALER per shard; scatter requests, gather the replies matched by seq."""

    def __init__(
        self,
        addresses: Sequence[str],
        sender: str,
        curve: CurveConfig | None = None,
        ctx: zmq.Context[Any] | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        if not addresses:
            raise ValueError("the paramserver needs at least one shard address")
        self.addresses = list(addresses)
        self.limits = limits
        self.clients = [Client(a, sender, curve=curve, ctx=ctx, limits=limits) for a in addresses]

    def __len__(self) -> int:
        return len(self.clients)

    def gather(self, requests: Mapping[int, Message], deadline: float) -> dict[int, Message]:
        """Send every request, then collect one reply per shard (``error`` replies included)."""
        seqs = {i: self.clients[i].send(msg) for i, msg in requests.items()}
        return self.collect(seqs, requests, deadline)

    def collect(self, seqs: Mapping[int, int], requests: Mapping[int, Message], deadline: float) -> dict[int, Message]:
        """One reply per shard to the requests already sent with these seqs."""
        out: dict[int, Message] = {}
        poller = zmq.Poller()
        by_sock = {}
        for i in seqs:
            poller.register(self.clients[i].sock, zmq.POLLIN)
            by_sock[self.clients[i].sock] = i
        while len(out) < len(seqs):
            left = deadline - time.monotonic()
            if left <= 0:
                pending = sorted(set(seqs) - set(out))
                raise CommTimeout(
                    f"paramserver shard(s) {pending} ({', '.join(self.addresses[i] for i in pending)}) "
                    f"did not answer {requests[pending[0]].type} in time"
                )
            for sock, _ in poller.poll(max(1, int(left * 1000))):
                i = by_sock[sock]
                reply = self._drain(i, seqs[i])
                if reply is not None:
                    out[i] = reply
                    poller.unregister(sock)
        return out

    def _drain(self, i: int, seq: int) -> Message | None:
        sock = self.clients[i].sock
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            try:
                msg = decode(frames, self.limits)
            except ProtocolError as exc:
                log.warning("undecodable reply from paramserver shard %d: %s", i, exc)
                continue
            if msg.get("ref_seq") in (seq, -1):
                return msg
            # else: a late reply to an earlier request that timed out

    def close(self) -> None:
        for c in self.clients:
            c.close()


def _raise_errors(replies: Mapping[int, Message], what: str) -> None:
    for i, r in sorted(replies.items()):
        if r.type == "error":
            raise RemoteError(r["reason"], f"paramserver shard {i}, {what}: {r['detail']}")


def _as_array(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, without importing torch here
        value = value.detach().cpu().numpy()
    return np.asarray(value)


class WeightsPublisher:
    """The learner's side: publish versions, run the round barrier.

    A shard on this host gets its slice as a file in /dev/shm that it takes
    over (see services/paramserver/shm.py) instead of payload frames; a shard
    that cannot map it (another host or container, shared memory off)
    answers ``shm_unavailable`` and gets frames from then on.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        sender: str = "learner",
        *,
        curve: CurveConfig | None = None,
        ctx: zmq.Context[Any] | None = None,
        shm: bool = True,
    ) -> None:
        self.shards = _Shards(addresses, sender, curve, ctx)
        self.layout: Layout | None = None
        self.use_shm = [shm and shmlib.available()] * len(self.shards)
        self.writer = shmlib.ShmWriter() if any(self.use_shm) else None
        self._pool: ThreadPoolExecutor | None = None  # writes the slices of several shards at once

    def layout_for(self, tensors: Mapping[str, np.ndarray]) -> Layout:
        specs = tuple(tensor_specs(tensors))
        if self.layout is None or self.layout.specs != specs:
            self.layout = Layout.from_specs(specs, len(self.shards))
        return self.layout

    def publish(self, version: int, tensors: Mapping[str, Any], timeout_s: float = 30.0) -> None:
        """Store ``version`` on every shard; returns once all acked (arrays may then be reused).

        Raises RemoteError (e.g. reason ``stale_version``, ``layout_mismatch``)
        or CommTimeout. A version refused by one shard is never assembled by
        a reader, since no reader assembles a version that not every shard holds.
        """
        deadline = time.monotonic() + timeout_s
        arrays = {str(k): _as_array(v) for k, v in tensors.items()}
        layout = self.layout_for(arrays)
        body = {"version": version, "num_shards": layout.num_shards, "layout": layout.fingerprint,
                "tensors": layout.to_wire()}
        requests: dict[int, Message] = {}
        seqs: dict[int, int] = {}
        files: dict[int, str] = {}
        try:
            self._send_all(body, {i: layout.slice(arrays, i) for i in range(len(self.shards))}, requests, seqs, files)
            replies = self.shards.collect(seqs, requests, deadline)
        except BaseException:
            for path in files.values():  # never answered: the shard did not take them over
                shmlib.discard(path)
            raise
        for path in files.values():
            # A shard renames a file it keeps before it acks, so the name is left only where
            # it was not kept (a retry, a refusal, another host): remove it either way.
            shmlib.discard(path)
        if self.writer is not None:
            for i in files:
                if replies[i].type == "publish_ack" and replies[i].get("free"):
                    self.writer.take_back(i, replies[i]["free"])
        again = [i for i in files if replies[i].type == "error" and replies[i]["reason"] == "shm_unavailable"]
        if again:
            for i in again:
                log.info("paramserver shard %d cannot map this host's shared memory (%s): publishing "
                         "with frames", i, replies[i]["detail"])
                self.use_shm[i] = False
            frames = {i: Message("publish", dict(body), layout.slice(arrays, i)) for i in again}
            replies.update(self.shards.gather(frames, deadline))
        _raise_errors(replies, f"publish of version {version}")
        if self.writer is not None:
            self._prepare_next(files)

    def _send_all(self, body: dict[str, Any], pieces: dict[int, dict[str, np.ndarray]],
                  requests: dict[int, Message], seqs: dict[int, int], files: dict[int, str]) -> None:
        """Send each shard its slice: frames at once, shared-memory files as soon as each is written.

        Slices for several shards are written by a thread each (pwrite drops
        the GIL), so sharding spreads the copy over the cores as frames spread
        the transfer; the sockets stay on this thread.
        """
        def send(i: int, msg: Message) -> None:
            requests[i] = msg
            seqs[i] = self.shards.clients[i].send(msg)

        to_write = [i for i, piece in pieces.items() if self.writer is not None and self.use_shm[i] and piece]
        for i, piece in pieces.items():
            if i not in to_write:
                send(i, Message("publish", dict(body), piece))
        written: Iterable[tuple[int, dict[str, Any] | None]]
        if len(to_write) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(min(len(self.shards), os.cpu_count() or 1), "publish-shm")
            futures = {self._pool.submit(self._write, i, pieces[i]): i for i in to_write}
            written = ((futures[f], f.result()) for f in as_completed(futures))
        else:
            written = ((i, self._write(i, pieces[i])) for i in to_write)
        for i, desc in written:
            if desc is not None:
                files[i] = desc["path"]
                send(i, Message("publish", {**body, "shm": desc}))
            else:
                send(i, Message("publish", dict(body), pieces[i]))

    def _write(self, i: int, piece: dict[str, np.ndarray]) -> dict[str, Any] | None:
        """Shard ``i``'s ``publish.shm`` field, or None (send frames) when /dev/shm cannot take it."""
        assert self.writer is not None
        try:
            return self.writer.write(i, piece)
        except OSError as exc:  # /dev/shm full: frames this time
            log.warning("could not write the slice of paramserver shard %d to shared memory (%s): "
                        "sending frames", i, exc)
            return None

    def _prepare_next(self, files: Mapping[int, str]) -> None:
        """Allocate the next version's files now, so the next publish is one copy per slice."""
        assert self.writer is not None
        for i in files:
            if self.use_shm[i]:
                try:
                    self.writer.prepare(i)
                except OSError:  # /dev/shm full: the next write allocates as it goes (or falls back)
                    pass

    def barrier(self, round: int, timeout_s: float) -> int:
        """Block until every live actor waits for version round + 1; returns how many.

        Raises CommTimeout when the barrier times out (or shard 0 does not answer).
        """
        msg = Message("barrier", {"round": round, "timeout_ms": int(timeout_s * 1000)})
        reply = self.shards.gather({0: msg}, time.monotonic() + timeout_s + WAIT_MARGIN_S)[0]
        if reply.type == "error" and reply["reason"] == "timeout":
            raise CommTimeout(reply["detail"])
        _raise_errors({0: reply}, f"barrier of round {round}")
        return int(reply["actors"])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        if self.writer is not None:
            self.writer.close()
        self.shards.close()


class WeightsReader:
    """The actors' side: one consistent version across all shards, never a mix."""

    def __init__(
        self,
        addresses: Sequence[str],
        sender: str,
        *,
        curve: CurveConfig | None = None,
        ctx: zmq.Context[Any] | None = None,
        timeout_s: float = 10.0,
        shm: bool = True,
    ) -> None:
        self.shards = _Shards(addresses, sender, curve, ctx)
        self.timeout_s = timeout_s
        self.version = -1  # newest version returned so far
        # Ask each shard for shared memory until it proves not to be on this host.
        self.use_shm = [shm and shmlib.available()] * len(self.shards)

    def _request(self, mtype: str, body: dict[str, Any], shards: Sequence[int]) -> dict[int, Message]:
        return {i: Message(mtype, {**body, "shm": True} if self.use_shm[i] else dict(body)) for i in shards}

    def _ask(self, mtype: str, body: dict[str, Any], shards: Sequence[int], deadline: float) -> dict[int, Message]:
        """Scatter/gather ``mtype``; a shard that fails a shared-memory request is asked again with frames.

        A shard that cannot serve shared memory (e.g. an older shard whose
        /dev/shm is full answers ``internal``) would otherwise fail every
        request of this reader: from then on this reader uses frames for it.
        """
        asked_shm = {i for i in shards if self.use_shm[i]}
        replies = self.shards.gather(self._request(mtype, body, shards), deadline)
        failed = [i for i, r in sorted(replies.items())
                  if i in asked_shm and r.type == "error" and r["reason"] in SHM_FALLBACK_REASONS]
        if failed:
            for i in failed:
                log.warning("paramserver shard %d failed a shared-memory %s (%s): using frames",
                            i, mtype, replies[i]["detail"])
                self.use_shm[i] = False
            if "timeout_ms" in body:  # a long poll: what is left of it
                left = deadline - WAIT_MARGIN_S - time.monotonic()
                body = {**body, "timeout_ms": max(0, int(left * 1000))}
            replies.update(self.shards.gather(self._request(mtype, body, failed), deadline))
        return replies

    def get_variables(self, have_version: int) -> Weights | None:
        return self.get(have_version)

    def get(self, have_version: int = -1, timeout_s: float | None = None) -> Weights | None:
        """The newest version every shard holds, or None if it is not newer than have_version."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        return self._resolve(self._get_all(have_version, deadline), have_version, deadline)

    def wait(self, min_version: int, timeout_s: float) -> Weights | None:
        """Long poll: a consistent version >= min_version, or None after timeout_s."""
        deadline = time.monotonic() + timeout_s
        body = {"min_version": min_version, "timeout_ms": int(timeout_s * 1000)}
        replies = self._ask("wait", body, range(len(self.shards)), deadline + WAIT_MARGIN_S)
        _raise_errors(replies, "wait")
        if any(r.type == "not_modified" for r in replies.values()):
            return None
        return self._resolve(replies, min_version - 1, deadline + WAIT_MARGIN_S)

    def _get_all(self, have: int, deadline: float) -> dict[int, Message]:
        return self._ask("get", {"have_version": have}, range(len(self.shards)), deadline)

    def _map_shm(self, parts: dict[int, Message]) -> tuple[dict[int, Message], bool]:
        """Map the pieces that came as shared memory; drop those that could not be mapped.

        Returns (usable parts, gone): ``gone`` when a version's file had already
        been dropped by its shard (ask again).
        """
        out: dict[int, Message] = {}
        gone = False
        for i, r in parts.items():
            desc = r.get("shm")
            if desc is not None and not r.arrays:
                try:
                    r.arrays = shmlib.map_arrays(desc)
                except shmlib.ShmUnavailable as exc:
                    log.info("paramserver shard %d: cannot use its shared memory (%s): using frames", i, exc)
                    self.use_shm[i] = False
                    continue
                except shmlib.ShmGone:
                    gone = True
                    continue
                except (ValueError, OSError) as exc:
                    raise RemoteError("bad_shm", f"paramserver shard {i}: {exc}") from None
            out[i] = r
        return out, gone

    def _resolve(self, replies: dict[int, Message], have: int, deadline: float) -> Weights | None:
        """Pick the newest version all shards hold and fetch the pieces still missing."""
        for _attempt in range(5):
            _raise_errors(replies, "get")
            held = [set(r["versions"]) for r in replies.values()]
            if not all(held):
                return None  # a shard holds nothing yet
            candidates = [v for v in set.intersection(*held) if v > have]
            if not candidates:
                if max(min(h) for h in held) > have and not set.intersection(*held):
                    # shards seen at different moments (a publish raced us): look again
                    replies = self._get_all(have, deadline)
                    continue
                return None
            version = max(candidates)
            parts = {i: r for i, r in replies.items() if r.type == "weights" and r["version"] == version}
            parts, gone = self._map_shm(parts)
            missing = [i for i in replies if i not in parts]
            if missing and not gone:
                exact = {"have_version": -1, "version": version}
                more = self._ask("get", exact, missing, deadline)
                gone = any(r.type == "error" and r["reason"] == "version_gone" for r in more.values())
                if not gone:
                    _raise_errors(more, f"get of version {version}")
                    more, gone = self._map_shm(more)
                    parts.update(more)
            if gone or len(parts) < len(replies):
                replies = self._get_all(have, deadline)  # newer publishes overtook us: look again
                continue
            return self._assemble(version, parts)
        return None  # shards keep disagreeing (publishes racing this reader): try again later

    def _assemble(self, version: int, parts: Mapping[int, Message]) -> Weights:
        layouts = {r["layout"] for r in parts.values()}
        versions = {r["version"] for r in parts.values()}
        if len(layouts) != 1 or versions != {version}:
            raise RemoteError("layout_mismatch", f"shards answered with layouts {sorted(layouts)} and "
                              f"versions {sorted(versions)}; refusing to mix them")
        tensors: dict[str, np.ndarray] = {}
        for i in sorted(parts):
            for name, arr in parts[i].arrays.items():
                if name in tensors:
                    raise RemoteError("layout_mismatch", f"tensor {name!r} came from two shards")
                tensors[name] = arr
        layout = layouts.pop()
        if fingerprint(tensor_specs(tensors), len(self.shards)) != layout:
            raise RemoteError("layout_mismatch", f"the tensors assembled for version {version} do not "
                              f"match layout {layout}")
        self.version = max(self.version, version)
        return version, dict(sorted(tensors.items()))

    def close(self) -> None:
        self.shards.close()


@dataclass(frozen=True)
class Welcome:
    index: int  # 0..N-1 for actors, -1 for evaluators and after goodbye
    num_actors: int  # live actors
    liveness_s: float  # silent this long -> removed
    fleet_env_steps: int = 0  # env steps all actors reported, restarts included


class RegistryClient:
    """An actor's registration with paramserver shard 0."""

    def __init__(
        self,
        address: str,
        actor_id: str,
        role: str = "actor",
        *,
        curve: CurveConfig | None = None,
        ctx: zmq.Context[Any] | None = None,
    ) -> None:
        self.actor_id = actor_id
        self.role = role
        self.client = Client(address, actor_id, curve=curve, ctx=ctx)

    def _call(self, msg: Message, timeout_s: float) -> Welcome:
        reply = self.client.request(msg, timeout_s)
        if reply.type != "welcome":
            raise RemoteError("unexpected_reply", f"expected welcome, got {reply.type}")
        return Welcome(reply["index"], reply["num_actors"], reply["liveness_ms"] / 1000,
                       reply.get("fleet_env_steps") or 0)

    def hello(self, timeout_s: float = 5.0) -> Welcome:
        return self._call(Message("hello", {"actor_id": self.actor_id, "role": self.role}), timeout_s)

    def heartbeat(self, version: int = -1, timeout_s: float = 5.0, env_steps: int | None = None) -> Welcome:
        body: dict[str, Any] = {"actor_id": self.actor_id, "role": self.role, "version": version}
        if env_steps is not None:
            body["env_steps"] = env_steps
        return self._call(Message("heartbeat", body), timeout_s)

    def goodbye(self, timeout_s: float = 5.0) -> Welcome:
        return self._call(Message("goodbye", {"actor_id": self.actor_id}), timeout_s)

    def close(self) -> None:
        self.client.close()
