"""The actors' and evaluators' paramserver client: one consistent weights version across all shards.

``get`` polls, ``wait`` long polls; both return one consistent version, the
newest that every shard holds, assembled from pieces that all carry that
version and the same layout, never a mix. Tensors come back as read-only
views of the received frames (or of a shared-memory file on the shards' host,
common/weights_shm). A reader that takes part in the barrier must use its
``actor_id`` as ``sender``: that is how shard 0 knows which actor a parked
``wait`` is from.

Every call takes a timeout and raises CommTimeout when it passes; an
``error`` reply raises RemoteError with the server's reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zmq

from rlfleet.common import weights_shm as shmlib
from rlfleet.common.clients.paramserver_shards import WAIT_MARGIN_S, ParamserverShards, checked_model, raise_errors
from rlfleet.common.tensor_shards import fingerprint, tensor_specs
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.errors import RemoteError
from rlfleet.common.wire.transport import CurveConfig

log = logging.getLogger(__name__)

Weights = tuple[int, dict[str, np.ndarray]]

#: error reasons after which a reader that asked for shared memory asks that shard again with frames
SHM_FALLBACK_REASONS = frozenset({"internal"})


class WeightsReader:
    """The actors' side: one consistent version across all shards, never a mix.

    ``model``: read a named model (e.g. the world model a model learner
    publishes) instead of the default one: every get and wait carries it, and
    its pieces come as payload frames (no shared memory). None, or
    ``DEFAULT_MODEL``: the default model, the messages as before.
    """

    def __init__(self, addresses: Sequence[str], sender: str, *, curve: CurveConfig | None = None,
                 ctx: zmq.Context[Any] | None = None, timeout_s: float = 10.0, shm: bool = True,
                 model: str | None = None) -> None:
        self.model = checked_model(model)
        self.shards = ParamserverShards(addresses, sender, curve, ctx)
        self.timeout_s = timeout_s
        self.version = -1  # newest version returned so far
        # Ask each shard for shared memory until it proves not to be on this host.
        self.use_shm = [shm and self.model is None and shmlib.available()] * len(self.shards)

    def _request(self, mtype: str, body: dict[str, Any], shards: Sequence[int]) -> dict[int, Message]:
        if self.model is not None:
            body = {**body, "model": self.model}
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

    def get(self, have_version: int = -1, timeout_s: float | None = None) -> Weights | None:
        """The newest version every shard holds, or None if it is not newer than have_version."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        return self._resolve(self._get_all(have_version, deadline), have_version, deadline)

    def wait(self, min_version: int, timeout_s: float) -> Weights | None:
        """Long poll: a consistent version >= min_version, or None after timeout_s."""
        deadline = time.monotonic() + timeout_s
        body = {"min_version": min_version, "timeout_ms": int(timeout_s * 1000)}
        replies = self._ask("wait", body, range(len(self.shards)), deadline + WAIT_MARGIN_S)
        raise_errors(replies, "wait")
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
            raise_errors(replies, "get")
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
                    raise_errors(more, f"get of version {version}")
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
