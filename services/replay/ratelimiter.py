"""Reverb's SampleToInsertRatio rate limiter, for batches.

The limiter keeps ``diff = inserts * samples_per_insert - samples`` (items
inserted and items sampled since the table was made) inside
``[min_diff, max_diff]``, a window of width ``error_buffer`` centred on
``samples_per_insert * min_size``:

- a sample may go when the table holds at least ``min_size`` items and one
  more sampled item keeps ``diff >= min_diff``; otherwise the learner is ahead
  and its request is held;
- an insert may go while the table is below ``min_size`` or one more inserted
  item keeps ``diff <= max_diff``; otherwise the actors are ahead and their
  inserts are held.

Note on ``error_buffer``: Reverb's scalar ``error_buffer`` is a half-width
(``min_diff = offset - error_buffer``); ours is the whole width of the window
(``max_diff - min_diff``). Reverb refuses ``max_diff - min_diff < 2 x max(1,
samples_per_insert)`` because such a window can block both sides at once; so
do we, with the same numbers.

Batches: a request of N items is admitted when its *first* item is (the rest
overshoot by at most N - 1). Admitting a batch only when all N items fit
would need a window wider than every batch to stay deadlock-free; admitting
on the first item keeps Reverb's guarantee for any batch size.

``samples_per_insert = None`` means "min size only": inserts always go,
samples go once the table holds ``min_size`` items.
"""

from __future__ import annotations

from typing import Any


class RateLimiterError(ValueError):
    """Settings that could deadlock or make no sense; refused at construction."""


class RateLimiter:
    def __init__(
        self, min_size: int, samples_per_insert: float | None = None, error_buffer: float | None = None
    ) -> None:
        if min_size < 1:
            raise RateLimiterError(f"min_size={min_size}: allowed: >= 1")
        self.min_size = int(min_size)
        self.samples_per_insert = samples_per_insert
        self.min_diff = float("-inf")
        self.max_diff = float("inf")
        if samples_per_insert is not None:
            if not samples_per_insert > 0:
                raise RateLimiterError(f"samples_per_insert={samples_per_insert}: allowed: > 0 or null")
            need = 2.0 * max(1.0, samples_per_insert)
            width = 100.0 * max(1.0, samples_per_insert) if error_buffer is None else float(error_buffer)
            if width < need:
                raise RateLimiterError(
                    f"error_buffer={width} is narrower than 2 x max(1, samples_per_insert) = {need}: "
                    "the limiter could block inserts and samples at the same time (deadlock); "
                    f"allowed: error_buffer >= {need}"
                )
            offset = samples_per_insert * self.min_size
            self.min_diff = offset - width / 2
            self.max_diff = offset + width / 2
        self.error_buffer = error_buffer
        self.inserts = 0
        self.samples = 0

    @property
    def diff(self) -> float:
        spi = self.samples_per_insert
        return 0.0 if spi is None else self.inserts * spi - self.samples

    def can_insert(self, size: int) -> bool:
        """May one more item go into a table that holds ``size`` items?"""
        if self.samples_per_insert is None or size + 1 <= self.min_size:
            return True
        return (self.inserts + 1) * self.samples_per_insert - self.samples <= self.max_diff

    def can_sample(self, size: int) -> bool:
        """May one more item be sampled from a table that holds ``size`` items?"""
        if size < self.min_size:
            return False
        if self.samples_per_insert is None:
            return True
        return self.inserts * self.samples_per_insert - (self.samples + 1) >= self.min_diff

    def inserted(self, n: int) -> None:
        self.inserts += n

    def sampled(self, n: int) -> None:
        self.samples += n

    def resume(self) -> None:
        """After a restart that lost the samples counted since the last snapshot (they are not logged):
        start from the window's centre rather than hold every insert until the learner has
        sampled all of that again (with a large table, for hours)."""
        if self.samples_per_insert is not None:
            centre = self.samples_per_insert * self.min_size
            self.samples = max(self.samples, int(self.inserts * self.samples_per_insert - centre))

    def state(self) -> dict[str, Any]:
        return {"inserts": self.inserts, "samples": self.samples}

    def restore(self, state: dict[str, Any]) -> None:
        self.inserts = int(state.get("inserts", 0))
        self.samples = int(state.get("samples", 0))
