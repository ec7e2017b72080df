"""An actor's episodes: returns per vector slot, one CSV row per finished episode, and the metrics
(env steps, episodes, mean return) that every acting service (actor, gradient worker) exports; with a
TensorBoard writer, each episode's return and the env steps/s by the actor's env steps."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.tboard import ScalarWriter


class EpisodeStats:
    """Episode returns per vector slot, aware of NEXT_STEP autoreset (the step after an end is a reset)."""

    def __init__(self, num_envs: int, next_step_reset: bool = True) -> None:
        self.returns = np.zeros(num_envs)
        self.resetting = np.zeros(num_envs, bool)
        self.next_step_reset = next_step_reset
        self.recent: deque[float] = deque(maxlen=20)

    def add(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> list[float]:
        live = ~self.resetting
        self.returns[live] += rewards[live]
        done = live & (terminated | truncated)
        finished = [float(r) for r in self.returns[done]]
        self.recent.extend(finished)
        self.returns[done] = 0.0
        if self.next_step_reset:
            self.resetting = done
        return finished


class EpisodeLog:
    """Every finished episode as a CSV row: what reports and the determinism test read. ``wall_s``: seconds
    since this log opened; ``env_steps``: this actor's own; ``wall_time``: Unix time, which `rlfleet report`
    puts on the run's clock."""

    FIELDS = "wall_s,env_steps,version,episode_return,wall_time\n"

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 (closed in close())
        if self._file.tell() == 0:
            self._file.write(self.FIELDS)
        self._start = time.time()

    def write(self, env_steps: int, version: int, returns: list[float]) -> None:
        now = time.time()
        self._file.writelines(f"{now - self._start:.3f},{env_steps},{version},{r:g},{now:.3f}\n" for r in returns)

    def close(self) -> None:
        self._file.close()


class Episodes:
    """What an acting service records each vector step: env steps, finished episodes and their returns."""

    RATE_EVERY_S = 5.0  # env steps/s to TensorBoard at most this often

    def __init__(self, metrics: ServiceMetrics, num_envs: int, next_step_reset: bool, path: Path,
                 tb: ScalarWriter | None = None) -> None:
        self.num_envs = num_envs
        self.tb = tb
        self._rate_from = (time.monotonic(), 0)
        self.stats = EpisodeStats(num_envs, next_step_reset)
        self.log = EpisodeLog(path)
        self.m_steps = metrics.counter("env_steps", "Environment steps taken (all vector slots).")
        self.m_episodes = metrics.counter("episodes", "Episodes finished.")
        self.m_return = metrics.gauge("episode_return", "Mean return of the last 20 episodes (exploring).")

    def step(self, env_steps: int, version: int, rewards: Any, terminated: np.ndarray, truncated: np.ndarray) -> None:
        """One vector step taken; ``env_steps``: this actor's env steps after it."""
        finished = self.stats.add(np.asarray(rewards, np.float64), terminated, truncated)
        if finished:
            self.log.write(env_steps, version, finished)
            self.m_episodes.inc(len(finished))
            self.m_return.set(float(np.mean(self.stats.recent)))
            if self.tb is not None:
                for r in finished:
                    self.tb.add("actor/episode_return", r, step=env_steps)
        self.m_steps.inc(self.num_envs)
        now = time.monotonic()
        if self.tb is not None and now - self._rate_from[0] >= self.RATE_EVERY_S:
            self.tb.add("actor/env_steps_per_s", (env_steps - self._rate_from[1]) / (now - self._rate_from[0]),
                        step=env_steps)
            self._rate_from = (now, env_steps)

    def close(self) -> None:
        self.log.close()
        if self.tb is not None:
            self.tb.close()
