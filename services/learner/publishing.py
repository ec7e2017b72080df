"""Asynchronous publishing off the training thread: the newest snapshot wins.

The training thread takes a snapshot of the weights (``core.weights()``: CPU
copies, on a GPU the one device-to-host copy) and hands it to a
:class:`BackgroundPublisher`. A thread of its own sends it to every
paramserver shard and waits for their acks, on a
:class:`~rlfleet.common.clients.weights_publisher.WeightsPublisher` of its own:
ZeroMQ sockets are not shared between threads, so the learner's publisher
(the start's publish, the barrier, the version probe) stays on the training
thread.

One slot, newest wins: a snapshot submitted while another is being sent
waits in the slot, and a newer one replaces it there (``replaced``), so a slow
paramserver gets the newest weights and never a backlog of old ones. What
happened to each snapshot sent (acked, a timeout, a refusal, or an error of
the thread itself) comes back as an :class:`Outcome` that the training thread
applies when it calls :meth:`BackgroundPublisher.drain`: the version a learner
reports, checkpoints and renumbers after is always one every shard acked.

Only the asynchronous protocol publishes here. At a barrier nobody can act
before the next version, so the learner publishes it on the training thread
and waits, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from rlfleet.common.clients.weights_publisher import WeightsPublisher

log = logging.getLogger("rlfleet.learner")


@dataclass(frozen=True)
class Outcome:
    """What became of one snapshot sent: ``error`` None once every shard acked ``version``; else
    the exception the publish raised (CommTimeout, RemoteError, or anything the thread hit)."""

    version: int
    weights: Mapping[str, np.ndarray]
    error: BaseException | None
    seconds: float
    tag: str = ""


class BackgroundPublisher:
    """A thread that publishes the snapshots handed to :meth:`submit`, one at a time, newest first.

    ``publisher``: a WeightsPublisher of the thread's own, which from now on only the thread uses
    (and closes); ``timeout_for(weights)``: how long one publish may wait for its acks.
    """

    def __init__(self, publisher: WeightsPublisher,
                 timeout_for: Callable[[Mapping[str, np.ndarray]], float]) -> None:
        self._timeout_for = timeout_for
        self._cond = threading.Condition()
        self._waiting: tuple[int, Mapping[str, np.ndarray], str] | None = None
        self._sending = False
        self._closing = False
        self._outcomes: list[Outcome] = []
        self.replaced = 0  # snapshots a newer one replaced before they were sent
        self._thread = threading.Thread(target=self._run, args=(publisher,), name="learner-publish",
                                        daemon=True)
        self._thread.start()

    # -- the training thread's side ---------------------------------------------------
    def submit(self, version: int, weights: Mapping[str, np.ndarray], tag: str = "") -> None:
        """Publish ``weights`` as ``version`` once the publish in flight (if any) is done; a snapshot
        still waiting for it is replaced (never sent). Returns at once."""
        with self._cond:
            if self._closing:
                raise RuntimeError("BackgroundPublisher.submit after close")
            if self._waiting is not None:
                self.replaced += 1
            self._waiting = (version, weights, tag)
            self._cond.notify_all()

    def drain(self) -> list[Outcome]:
        """The outcomes of the publishes that finished since the last call, oldest first."""
        with self._cond:
            out, self._outcomes = self._outcomes, []
        return out

    @property
    def busy(self) -> bool:
        """A snapshot is being sent or waits to be."""
        with self._cond:
            return self._sending or self._waiting is not None

    def wait_idle(self, timeout_s: float) -> bool:
        """Until nothing is being sent or waits (True), or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._sending or self._waiting is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float) -> None:
        """Drop a snapshot that still waits, let the one in flight finish (its outcome stays for
        :meth:`drain`) for up to ``timeout_s``, and end the thread."""
        with self._cond:
            self._closing = True
            if self._waiting is not None:
                log.info("learner: version %d not published (stopping)", self._waiting[0])
                self._waiting = None
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("learner: the publish in flight did not finish within %.1f s of stopping", timeout_s)

    # -- the thread ---------------------------------------------------------------------
    def _run(self, publisher: WeightsPublisher) -> None:
        try:
            while True:
                with self._cond:
                    while self._waiting is None and not self._closing:
                        self._cond.wait()
                    if self._waiting is None:  # closing, nothing left to send
                        return
                    version, weights, tag = self._waiting
                    self._waiting = None
                    self._sending = True
                start = time.monotonic()
                error: BaseException | None = None
                try:
                    publisher.publish(version, weights, timeout_s=self._timeout_for(weights))
                except Exception as exc:  # noqa: BLE001 - handed to the training thread, which decides
                    error = exc
                with self._cond:
                    self._outcomes.append(Outcome(version, weights, error, time.monotonic() - start, tag))
                    self._sending = False
                    self._cond.notify_all()
        finally:
            publisher.close()
