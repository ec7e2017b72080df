"""The serial runner: one algorithm in one process, no sockets and no services.

It runs the objects the fleet runs, built by the same algorithm folder, in a loop a reader can
follow top to bottom: the reference the fleet is judged against (same config, same seeds), and
the tool that tells an algorithm bug from a fleet effect.

- **Lanes**: one per actor of the config (``actor.count``), each what an actor service holds: its
  vector env (seeded as that actor's), its policy (exploring as that actor would, Ape-X epsilon
  included) and its adder. Every lane takes one vector step per iteration.
- **Table**: the learner's replay table (``learner.table``), the replay service's own table class
  with its rate limiter, so sampling is the fleet's.
- **Learner**: the algorithm's, fed as the learner service feeds it:
  - ``sync: async``: learn calls while the table's rate limiter lets a batch be sampled
    (``samples_per_insert``); a table with no ratio (a queue, or null) gives one learn call per
    iteration once it holds a batch. A new version every ``learner.publish_every`` updates.
  - ``sync: barrier``: every ``actor.steps_per_round`` iterations, the learner's round
    (:class:`rlfleet.common.algorithms.rounds.Round`), then a new version.
  A new version is loaded into every lane at once: the only staleness left is the publish period.
- **Evaluation**: greedy, as the evaluator scores (:func:`rlfleet.common.evaluation.evaluate`), every
  ``evaluator.every_steps`` env steps (5,000 when unset).

- **Gradient workers** (A3C/A2C/HogWild: no learner, the paramserver's optimizer applies what workers
  push): a lane per worker and one optimizer, as :mod:`rlfleet.cli.serial_workers` says.

Not run here: planning (Dyna-Q's planners); it is refused with the reason.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlfleet.cli import runstart
from rlfleet.cli.ending import Ending
from rlfleet.cli.ending import write as write_ending
from rlfleet.cli.serial_workers import WorkerPool
from rlfleet.common import algorithms
from rlfleet.common.algorithms.checkpoint import save_checkpoint
from rlfleet.common.algorithms.device_choice import choose_device, probe_cuda
from rlfleet.common.config import Experiment, dump
from rlfleet.common.envs import make_vector_env, probe_env
from rlfleet.common.evaluation import EVAL_SEED_OFFSET, eval_envs, evaluate
from rlfleet.services.replay.columnar import Sampled
from rlfleet.services.replay.tables import make_table

log = logging.getLogger("rlfleet.serial")

DEFAULT_EVAL_EVERY = 5_000  # env steps between evaluations when evaluator.every_steps is unset


class SerialError(ValueError):
    """The experiment asks for something the serial runner does not run; the message says what."""


@dataclass
class Evaluation:
    wall_s: float  # from the runner's start
    env_steps: int
    version: int
    mean: float
    std: float


@dataclass
class SerialResult:
    solved: bool  # an evaluation reached the target (False when no target was given)
    env_steps: int
    updates: int
    version: int
    wall_s: float
    evaluations: list[Evaluation] = field(default_factory=list)

    @property
    def best(self) -> float | None:
        return max((e.mean for e in self.evaluations), default=None)

    @property
    def env_steps_to_target(self) -> int | None:
        return self.evaluations[-1].env_steps if self.solved else None

    @property
    def wall_s_to_target(self) -> float | None:
        return self.evaluations[-1].wall_s if self.solved else None


def check_serial(cfg: Experiment) -> None:
    """Raise :class:`SerialError` if the serial runner cannot run ``cfg``, naming the field and what is allowed."""
    if cfg.planning.enabled:
        raise SerialError("planning.enabled=true: the serial runner has no planners; allowed: planning.enabled=false")


class Lane:
    """What one actor service holds: vector env, policy and adder, seeded as actor ``index``."""

    def __init__(self, cfg: Experiment, algo: algorithms.Builder, index: int) -> None:
        self.index = index
        seed = cfg.seed * 100_003 + index * cfg.env.num_envs  # the actor service's env seeds
        self.envs = make_vector_env(cfg.env, seed, algo.autoreset_mode)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        self.policy = algo.make_policy(cfg.algorithm, obs_space, act_space, device="cpu", seed=cfg.seed,
                                       act_seed=[cfg.seed, index, 1])
        self.adder = algo.make_adder(cfg.algorithm, cfg.env.num_envs, obs_space, act_space, algo.autoreset_mode)
        self.obs, _ = self.envs.reset(seed=[seed + j for j in range(cfg.env.num_envs)])  # type: ignore[arg-type]
        self.adder.reset(self.obs)
        self.episode_returns: list[float] = []
        self._running = np.zeros(cfg.env.num_envs)

    def step(self, version: int) -> dict[str, np.ndarray]:
        """One vector step; the items it completed, each marked with ``version``."""
        actions, extras = self.policy.act(self.obs)
        self.obs, rewards, terminated, truncated, infos = self.envs.step(actions)
        self._running += rewards
        for slot in np.flatnonzero(np.asarray(terminated) | np.asarray(truncated)):
            self.episode_returns.append(float(self._running[slot]))
            self._running[slot] = 0.0
        return self.adder.add(actions, extras, self.obs, rewards, terminated, truncated, infos, version)

    def close(self) -> None:
        self.envs.close()


class SerialRunner:
    """The algorithm of ``cfg`` alone: :meth:`run` trains until a target return or a budget."""

    def __init__(self, cfg: Experiment, run_dir: str | Path | None = None) -> None:
        check_serial(cfg)
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.algo = algorithms.get(cfg.algorithm.name)
        self.actors = cfg.actor.count
        obs_space, act_space = probe_env(cfg)
        self.algo.check_env(cfg.algorithm, obs_space, act_space, cfg.env.id)
        # the learner service's threads, set before its networks are made: an initialisation (orthogonal:
        # a QR decomposition) rounds differently with another thread count
        self._threads = torch.get_num_threads()
        torch.set_num_threads(cfg.learner.torch_threads)
        self.version = 0
        self.env_steps = 0
        self._since_publish = 0
        self._steps_in_round = 0  # barrier: vector steps of the round so far
        self.started_at = time.time()
        self.eval_policy = self.algo.make_policy(cfg.algorithm, obs_space, act_space, device="cpu", seed=cfg.seed)
        # gradient workers: lanes and the paramserver's optimizer instead of a learner, table and actors
        self.pool = WorkerPool(cfg, self.algo) if cfg.algorithm.trains_with_workers() else None
        if self.pool is not None:
            self.lanes: list[Lane] = []
            return
        def parameters() -> int:  # auto with CUDA usable: how big the networks are (the learner service's rule)
            cpu = self.algo.make_learner(cfg.algorithm, obs_space, act_space, device="cpu", seed=cfg.seed)
            return sum(int(w.size) for w in cpu.weights().values())

        device = choose_device(cfg.learner.device, probe_cuda, parameters)
        log.info("serial: the learner trains on %s (%s): %s", device.device, device.reason, device.detail)
        self.learner = self.algo.make_learner(cfg.algorithm, obs_space, act_space, device=device.device,
                                              seed=cfg.seed)
        table_cfg = next(t for t in cfg.replay.tables if t.name == cfg.learner.table)
        self.table = make_table(table_cfg, np.random.default_rng([cfg.seed, 7]))
        self.lanes = [Lane(cfg, self.algo, i) for i in range(self.actors)]
        for lane in self.lanes:  # version 0, as the fleet's actors get it from the paramserver
            lane.policy.load_weights(self.learner.weights())
        self.round = self.algo.make_round(self.learner, cfg.learner.updates_per_round,
                                          self.actors * cfg.env.num_envs, cfg.actor.steps_per_round)

    # -- acting -----------------------------------------------------------------
    def act(self) -> None:
        """Every lane one vector step; what the adders complete goes into the table."""
        for lane in self.lanes:
            lane.policy.explore(lane.index, self.actors, self.env_steps)
            items = lane.step(self.version)
            self.env_steps += self.cfg.env.num_envs
            if len(items["version"]):
                self.table.insert(items, lane.policy.priorities(items))

    # -- learning ---------------------------------------------------------------
    def sample(self, batch_items: int) -> Sampled:
        return self.table.sample(batch_items)

    def learn(self, batch: Sampled | dict[str, np.ndarray]) -> None:
        """Drop stale items, learn on the rest, write priorities back (as the learner service does)."""
        keys: np.ndarray | None = None
        weights: np.ndarray | None = None
        if isinstance(batch, Sampled):
            keys, data, weights = batch.keys, batch.data, self.learner.weigh(batch.probability)
        else:  # a round's items, in one batch: unweighted
            data = batch
        kept, weights, stale, invalid = algorithms.drop_stale(data, self.version, self.learner.data.max_staleness,
                                                              weights)
        dropped = stale + invalid
        if len(kept["version"]) == 0:
            return
        before = self.learner.num_updates
        _, priorities = self.learner.learn(kept, weights)
        if priorities is not None and keys is not None and not dropped:
            self.table.update_priorities(keys, priorities)
        self._since_publish += self.learner.num_updates - before

    def learn_async(self) -> None:
        """What the learner service does between two of the actors' steps in the async protocol."""
        batch = self.learner.data.batch_items
        if self.table.limiter.samples_per_insert is None:  # no ratio: one learn call a step
            if self.table.size >= max(batch if self.table.kind == "queue" else 1, self.table.limiter.min_size):
                self.learn(self.sample(batch))
        else:
            while self.table.can_sample():
                self.learn(self.sample(batch))
        if self._since_publish >= self.cfg.learner.publish_every:
            self.publish()

    def learn_round(self) -> None:
        """The barrier round: the round's learn calls, then the next version."""
        if self.table.size >= self.table.limiter.min_size:
            self.round.run(self.sample, self.learn)
        self.publish()

    def publish(self) -> None:
        self.version += 1
        self._since_publish = 0
        weights = self.learner.weights()
        for lane in self.lanes:
            lane.policy.load_weights(weights)

    def step(self) -> None:
        """One iteration: every lane acts one vector step, then what the protocol learns after it."""
        if self.pool is not None:
            self.pool.step()
            self.env_steps, self.version = self.pool.env_steps, self.pool.version
            return
        self.act()
        if self.cfg.sync == "async":
            self.learn_async()
        else:
            self._steps_in_round += 1
            if self._steps_in_round == self.cfg.actor.steps_per_round:
                self._steps_in_round = 0
                self.learn_round()

    def weights(self) -> dict[str, np.ndarray]:
        """The newest weights (the learner's, or the workers' optimizer's)."""
        return self.pool.weights() if self.pool is not None else self.learner.weights()

    @property
    def updates(self) -> int:
        return self.pool.updates if self.pool is not None else self.learner.num_updates

    # -- the loop ---------------------------------------------------------------
    def run(self, until_return: float | None = None, max_env_steps: int | None = None,
            max_seconds: float | None = None, on_eval: Callable[[Evaluation], None] | None = None) -> SerialResult:
        """Train until an evaluation reaches ``until_return`` or a budget is spent."""
        cfg = self.cfg
        start = time.perf_counter()
        self.started_at = time.time()
        every = cfg.evaluator.every_steps or DEFAULT_EVAL_EVERY
        next_eval = every
        eval_seed = cfg.seed + EVAL_SEED_OFFSET
        envs = eval_envs(cfg, cfg.evaluator.episodes, eval_seed)
        result = SerialResult(False, 0, 0, 0, 0.0)
        self._steps_in_round = 0
        try:
            while True:
                self.step()
                wall = time.perf_counter() - start
                if self.env_steps >= next_eval:
                    next_eval += every
                    self.eval_policy.load_weights(self.weights())
                    returns = evaluate(self.eval_policy, cfg, cfg.evaluator.episodes, eval_seed, envs)
                    wall = time.perf_counter() - start
                    e = Evaluation(wall, self.env_steps, self.version, float(returns.mean()), float(returns.std()))
                    result.evaluations.append(e)
                    log.info("serial: %d env steps, %d updates, v%d: return %.1f +- %.1f (%.1f s)", e.env_steps,
                             self.updates, e.version, e.mean, e.std, e.wall_s)
                    if on_eval is not None:
                        on_eval(e)
                    if until_return is not None and e.mean >= until_return:
                        result.solved = True
                        break
                if max_env_steps is not None and self.env_steps >= max_env_steps:
                    break
                if max_seconds is not None and wall >= max_seconds:
                    break
        finally:
            envs.close()
        result.env_steps, result.updates, result.version = self.env_steps, self.updates, self.version
        result.wall_s = time.perf_counter() - start
        if self.run_dir is not None:
            self.write(result)
        return result

    def write(self, result: SerialResult) -> None:
        """The run directory: config.yaml, evaluations.csv (the evaluator's columns, Unix time), the learner's
        checkpoint (``rlfleet eval`` reads it) and result.json."""
        assert self.run_dir is not None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump(self.cfg))
        rows = ["wall_time,env_steps,version,mean_return,std_return,episodes,seconds"]
        episodes = self.cfg.evaluator.episodes
        rows += [f"{self.started_at + e.wall_s:.3f},{e.env_steps},{e.version},{e.mean:.4f},{e.std:.4f},{episodes},"
                 for e in result.evaluations]
        (self.run_dir / "evaluations.csv").write_text("\n".join(rows) + "\n")
        weights = {k: torch.from_numpy(np.array(v)) for k, v in self.weights().items()}
        core = self.pool.state() if self.pool is not None else self.learner.state()
        save_checkpoint(self.run_dir / self.cfg.learner.dir / "checkpoint.pt",
                        {"core": core, "version": self.version, "config": dump(self.cfg),
                         "weights": weights})
        summary: dict[str, Any] = {**asdict(result), "best": result.best}
        (self.run_dir / "result.json").write_text(json.dumps(summary, indent=1) + "\n")

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()
        if self.pool is not None:
            self.pool.close()
        torch.set_num_threads(self._threads)


def train_serial(cfg: Experiment, until_return: float | None = None, max_env_steps: int | None = None,
                 max_seconds: float | None = None, run_dir: str | Path | None = None,
                 on_eval: Callable[[Evaluation], None] | None = None, started_at: float | None = None) -> SerialResult:
    """Build a :class:`SerialRunner` for ``cfg``, run it, close it; with ``run_dir``, its run.json (the target
    and budgets, ``started_at``: the command's start, default now; cli/runstart.py) and ending.json too."""
    if run_dir is not None:
        runstart.begin(run_dir, time.time() if started_at is None else started_at, until_return, max_env_steps,
                       max_seconds)
    runner = SerialRunner(cfg, run_dir)
    try:
        result = runner.run(until_return, max_env_steps, max_seconds, on_eval)
    finally:
        runner.close()
    if run_dir is not None:
        write_ending(run_dir, serial_ending(result, runner.started_at, until_return, max_env_steps, max_seconds))
    return result


def serial_ending(result: SerialResult, started_at: float, until_return: float | None, max_env_steps: int | None,
                  max_seconds: float | None) -> Ending:
    """How a serial run ended, with the exit code `rlfleet train` gives it."""
    if result.solved:
        last = result.evaluations[-1]
        how, detail = "target", (f"eval return {last.mean:.1f} >= {until_return:g} after {last.wall_s:.0f} s, "
                                 f"{last.env_steps} env steps")
    else:
        spent = max_env_steps is not None and result.env_steps >= max_env_steps
        how = "budget"
        detail = f"env-step budget spent ({result.env_steps} >= {max_env_steps})" if spent else \
            f"time is up ({max_seconds} s)"
    code = 0 if result.solved or until_return is None else 3
    return Ending(how, detail, code, result.env_steps, result.wall_s, started_at, result.best, until_return,
                  max_env_steps, max_seconds)
