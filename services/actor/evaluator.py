"""The evaluator: an actor that acts greedily, inserts nothing and reports returns.

Each evaluation runs ``evaluator.episodes`` episodes at once (one per vector
slot, the first episode of each slot counts) on the newest weights version,
with fixed seeds, so the same version always gets the same score.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from gymnasium.vector import VectorEnv

from rlfleet.common.config import Experiment
from rlfleet.common.envs import acting_policy
from rlfleet.common.evaluation import EVAL_SEED_OFFSET, eval_envs, evaluate
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.tboard import scalar_writer
from rlfleet.common.wire.errors import CommTimeout, RemoteError
from rlfleet.services.actor.best import BestKeeper
from rlfleet.services.actor.member import FleetMember

log = logging.getLogger("rlfleet.evaluator")

class EvaluatorService(FleetMember):
    def __init__(self, cfg: Experiment, actor_id: str) -> None:
        super().__init__(cfg, actor_id, "evaluator")
        self.policy = acting_policy(cfg)
        self.metrics = ServiceMetrics("evaluator", 0)
        m = self.metrics
        self.m_return = m.gauge("eval_return", "Mean return of the last evaluation (greedy).")
        self.m_std = m.gauge("eval_return_std", "Standard deviation of the last evaluation's returns.")
        self.m_version = m.gauge("eval_version", "Weights version of the last evaluation.")
        self.m_evals = m.counter("evaluations", "Evaluations done.")
        self.m_seconds = m.gauge("eval_seconds", "Seconds the last evaluation took.")
        self.version = -1
        self.last: dict[str, float] = {}  # version, mean, std, seconds of the last evaluation
        self.csv_path = Path(cfg.run_dir) / "evaluations.csv"
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        self._csv = open(self.csv_path, "a", buffering=1)  # noqa: SIM115 (closed in close())
        if self._csv.tell() == 0:
            self._csv.write("wall_time,env_steps,version,mean_return,std_return,episodes,seconds\n")
        self.tb = scalar_writer(cfg, "evaluator")  # RUN_DIR/tensorboard/evaluator
        self._envs: VectorEnv | None = None  # type: ignore[type-arg]
        self.best = BestKeeper(cfg)  # RUN_DIR/evaluator/best.pt: the weights of the best evaluation

    def run(self) -> None:
        """Evaluate each new version (paced by every_s), or at every multiple of every_steps env steps."""
        cfg = self.cfg.evaluator
        next_at = cfg.every_steps or 0
        seen = 0
        while not self._stopping:
            if cfg.every_steps:
                welcome = self.links.heartbeat(self.version)
                if welcome is None:
                    self._sleep(0.1)
                    continue
                steps = welcome.fleet_env_steps
                if steps < seen:  # a restarted paramserver counts again from what the live actors report
                    next_at = (steps // cfg.every_steps + 1) * cfg.every_steps
                seen = steps
                if steps < next_at:
                    self._sleep(0.1)
                    continue
                next_at = (steps // cfg.every_steps + 1) * cfg.every_steps
                self._evaluate(self._fetch(lambda: self.links.reader.get(self.version)), steps)
            else:
                self.links.heartbeat(self.version)
                got = self._fetch(lambda: self.links.reader.wait(self.version + 1, self.cfg.actor.heartbeat_s))
                if got is not None:
                    self._evaluate(got, None)
                    self._sleep(cfg.every_s - self.last.get("seconds", 0.0))

    def _fetch(self, call: Any) -> tuple[int, dict[str, Any]] | None:
        try:
            return call()  # type: ignore[no-any-return]
        except (CommTimeout, RemoteError) as exc:
            log.warning("evaluator: weights unavailable (%s)", exc)
            self._sleep(0.5)
            return None

    def _evaluate(self, got: tuple[int, dict[str, Any]] | None, env_steps: int | None) -> None:
        """Score the newest weights; the same version as last time keeps its (deterministic) score."""
        cfg = self.cfg.evaluator
        if got is not None:
            version, tensors = got
            self.policy.load_weights(tensors)
            self.version = version
            start = time.monotonic()
            seed = self.cfg.seed + EVAL_SEED_OFFSET
            if self._envs is None:  # made once: an async vector env's processes outlive each evaluation
                self._envs = eval_envs(self.cfg, cfg.episodes, seed)
            returns = evaluate(self.policy, self.cfg, cfg.episodes, seed, self._envs)
            self.last = {"version": version, "mean": float(returns.mean()), "std": float(returns.std()),
                         "seconds": time.monotonic() - start}
            log.info("eval v%d: return %.1f +- %.1f over %d episodes (%.1f s)", version, self.last["mean"],
                     self.last["std"], cfg.episodes, self.last["seconds"])
            if self.best.offer(version, self.last["mean"], self.last["std"], env_steps, tensors):
                log.info("eval v%d: the best so far, kept as %s", version, self.best.path)
        elif not self.last:
            return  # no weights yet
        self.m_return.set(self.last["mean"])
        self.m_std.set(self.last["std"])
        self.m_version.set(self.last["version"])
        self.m_seconds.set(self.last["seconds"])
        self.m_evals.inc()
        steps = "" if env_steps is None else env_steps
        self._csv.write(f"{time.time():.3f},{steps},{self.last['version']},{self.last['mean']:.4f},"
                        f"{self.last['std']:.4f},{cfg.episodes},{self.last['seconds']:.3f}\n")
        if got is not None:  # TensorBoard: by weights version always, by fleet env steps when known
            self.tb.add("eval/mean_return_by_version", self.last["mean"], step=int(self.last["version"]))
            if env_steps is not None:
                self.tb.add_many({"eval/mean_return": self.last["mean"], "eval/std_return": self.last["std"]},
                                 step=env_steps)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < end:
            time.sleep(min(0.1, end - time.monotonic()))

    def health(self) -> dict[str, Any]:
        return {"ok": not self._stopping, "version": self.version, "last": self.last}

    def close(self) -> None:
        if self._envs is not None:
            self._envs.close()
        self.links.close()
        self._csv.close()
        self.tb.close()
