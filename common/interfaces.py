"""The roles rlfleet's services implement, in the manner of Acme's core.

Every service is one of these wired to sockets; tests swap real sockets for
inproc ones, never for mocks.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import numpy as np

Arrays = Mapping[str, np.ndarray]


class VariableSource(abc.ABC):
    """Where an actor gets its weights (the paramserver client)."""

    @abc.abstractmethod
    def get_variables(self, have_version: int) -> tuple[int, dict[str, np.ndarray]] | None:
        """The newest consistent (version, tensors), or None if not newer than have_version."""


class Actor(abc.ABC):
    """Acts in an environment and feeds what it sees to an adder."""

    @abc.abstractmethod
    def select_action(self, observation: np.ndarray) -> np.ndarray:
        """Actions for a batch of observations (one per vector-env slot)."""

    @abc.abstractmethod
    def observe(self, transition: Arrays) -> None:
        """Record the outcome of the last actions."""

    @abc.abstractmethod
    def update(self, wait: bool = False) -> None:
        """Fetch newer weights from the variable source (block for them if wait)."""


class ReplayClient(abc.ABC):
    """Inserts into and samples from replay tables."""

    @abc.abstractmethod
    def insert(self, table: str, columns: Arrays, priorities: np.ndarray | None = None) -> None:
        """Queue a batch for insertion; delivery is acked and retried."""

    @abc.abstractmethod
    def sample(self, table: str, batch_size: int, beta: float | None = None) -> Any:
        """One batch with keys, probabilities and importance weights."""

    @abc.abstractmethod
    def update_priorities(self, table: str, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Set new priorities for sampled keys (fire and forget)."""


class Saveable(abc.ABC):
    """State that survives a restart."""

    @abc.abstractmethod
    def save(self) -> Any:
        """A snapshot of the state (arrays, tensors, plain values)."""

    @abc.abstractmethod
    def restore(self, state: Any) -> None:
        """Resume from a snapshot made by save()."""


class Learner(VariableSource, Saveable):
    """Turns sampled experience into new weights."""

    @abc.abstractmethod
    def step(self) -> dict[str, float]:
        """One update; returns its figures (loss, ...)."""


class Worker(abc.ABC):
    """Anything with a main loop."""

    @abc.abstractmethod
    def run(self) -> None:
        """Run until stopped."""

    def stop(self) -> None:  # noqa: B027 (optional hook)
        """Ask run() to return soon (from a signal handler or another thread)."""
