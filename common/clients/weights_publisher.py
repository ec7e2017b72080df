"""The learner's paramserver client: publish weights versions, run the round barrier.

``publish(version, tensors)`` sends each shard its slice in parallel and
returns once every shard acked; ``barrier(round)`` blocks until every live
actor waits for round + 1. The learner asks which versions the shards hold
through a :class:`~rlfleet.common.clients.version_probe.VersionProbe` on the same
connections (``publisher.shards``): one paramserver client, not three.

Every call takes a timeout and raises CommTimeout when it passes; an
``error`` reply raises RemoteError with the server's reason.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import numpy as np
import zmq

from rlfleet.common import weights_shm as shmlib
from rlfleet.common.clients.paramserver_shards import WAIT_MARGIN_S, ParamserverShards, checked_model, raise_errors
from rlfleet.common.tensor_shards import Layout, tensor_specs
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.errors import CommTimeout
from rlfleet.common.wire.transport import CurveConfig

log = logging.getLogger(__name__)


def _as_array(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, without importing torch here
        value = value.detach().cpu().numpy()
    return np.asarray(value)


class WeightsPublisher:
    """The learner's side: publish versions, run the round barrier.

    A shard on this host gets its slice as a file in /dev/shm that it takes
    over (see common/weights_shm) instead of payload frames; a shard
    that cannot map it (another host or container, shared memory off)
    answers ``shm_unavailable`` and gets frames from then on.

    ``model``: publish a named model (a second model, e.g. a world model)
    instead of the default one: every publish carries it, always with payload
    frames (shards serve named models without shared memory). None, or
    ``DEFAULT_MODEL``: the default model, the messages as before.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        sender: str = "learner",
        *,
        curve: CurveConfig | None = None,
        ctx: zmq.Context[Any] | None = None,
        shm: bool = True,
        model: str | None = None,
    ) -> None:
        self.model = checked_model(model)
        self.shards = ParamserverShards(addresses, sender, curve, ctx)
        self.layout: Layout | None = None
        self.use_shm = [shm and self.model is None and shmlib.available()] * len(self.shards)
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
        if self.model is not None:
            body["model"] = self.model
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
        raise_errors(replies, f"publish of version {version}")
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
            seqs[i] = self.shards.send(i, msg)

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
        raise_errors({0: reply}, f"barrier of round {round}")
        return int(reply["actors"])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        if self.writer is not None:
            self.writer.close()
        self.shards.close()
