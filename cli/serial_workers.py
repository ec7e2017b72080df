"""Gradient workers in the serial runner: A3C/A2C/HogWild's workers and the paramserver's optimizer in one process.

Each :class:`WorkerLane` is what a worker service holds: its vector env (seeded as that worker's), the
algorithm's worker (policy and loss), its adder. :class:`WorkerPool` holds the lanes and one
:class:`rlfleet.services.paramserver.gradients.SliceTrainer` over the whole model (a shard's trainer; a shard's
optimizer steps each element on its own, so one slice of everything is the shards together), stepping
with ``paramserver.gradients`` as the shards do:

- ``sync: async``: after a vector step of every lane, each lane that completed a rollout computes its
  gradient with the weights it acted with; they are applied one after the other (the second is one
  version behind, as a worker's push that follows another's), then every lane loads the newest weights.
- ``sync: barrier``: the mean of the lanes' gradients, one step (the paramserver's round).

With one lane of the config's envs this is the textbook synchronous algorithm (A2C: SB3's update,
tests/unit/algorithms/test_a2c_matches_sb3.py), so a fleet run that fails where the serial one solves
points at the fleet (staleness, pacing), and one that fails here too at the algorithm or its settings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from rlfleet.common import algorithms
from rlfleet.common.algorithms.contract import GradientWorker
from rlfleet.common.config import Experiment
from rlfleet.common.envs import make_vector_env
from rlfleet.services.paramserver.gradients import Refusal, SliceTrainer

log = logging.getLogger("rlfleet.serial")


class WorkerLane:
    """What one worker service holds: vector env, the algorithm's worker and adder, seeded as worker ``index``."""

    def __init__(self, cfg: Experiment, algo: algorithms.Builder, index: int) -> None:
        self.index = index
        self.num_envs = cfg.env.num_envs
        seed = cfg.seed * 100_003 + index * cfg.env.num_envs  # the worker service's env seeds
        self.envs = make_vector_env(cfg.env, seed, algo.autoreset_mode)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        self.worker: GradientWorker = algo.make_worker(cfg.algorithm, obs_space, act_space, seed=cfg.seed,
                                                       act_seed=[cfg.seed, index, 1])
        self.adder = algo.make_adder(cfg.algorithm, cfg.env.num_envs, obs_space, act_space, algo.autoreset_mode)
        self.obs, _ = self.envs.reset(seed=[seed + j for j in range(cfg.env.num_envs)])  # type: ignore[arg-type]
        self.adder.reset(self.obs)

    def step(self, version: int) -> dict[str, np.ndarray] | None:
        """One vector step; the gradients of the rollout it completed (None: none completed, or the worker
        has nothing to push yet)."""
        actions, extras = self.worker.act(self.obs)
        self.obs, rewards, terminated, truncated, infos = self.envs.step(actions)
        items = self.adder.add(actions, extras, self.obs, rewards, terminated, truncated, infos, version)
        if not len(items["version"]):
            return None
        grads, _ = self.worker.gradients(items)
        return grads

    def close(self) -> None:
        self.envs.close()


class WorkerPool:
    """The lanes of a gradient-worker experiment and the optimizer that applies their gradients."""

    def __init__(self, cfg: Experiment, algo: algorithms.Builder) -> None:
        self.cfg = cfg
        self.lanes = [WorkerLane(cfg, algo, i) for i in range(cfg.actor.count)]
        self.trainer = SliceTrainer(cfg.paramserver.gradients, cfg.paramserver.max_gradient_norm)
        self.trainer.follow(0, self.lanes[0].worker.weights())  # version 0: the experiment seed's weights
        self.version = 0
        self.updates = 0
        self.refused = 0  # gradients a shard would refuse (non-finite, or above paramserver.max_gradient_norm)
        self.env_steps = 0
        self._weights = self.trainer.flat.views(self.trainer.params.copy())  # type: ignore[union-attr]

    def step(self) -> None:
        """Every lane one vector step; the gradients of completed rollouts applied (see the module)."""
        version = self.version
        pushed = []
        for lane in self.lanes:
            lane.worker.explore(lane.index, len(self.lanes), self.env_steps)
            grads = lane.step(version)
            self.env_steps += lane.num_envs
            if grads is not None:
                pushed.append(grads)
        if not pushed:
            return
        if self.cfg.sync == "barrier":
            flat = [g for g in (self._gather(grads) for grads in pushed) if g is not None]
            if flat:
                self._weights = self._step(self.trainer.step, np.mean(flat, axis=0, dtype=np.float32))
        else:
            for grads in pushed:
                self._weights = self._step(self.trainer.apply, grads)
        self.version = self.trainer.version
        for lane in self.lanes:
            lane.worker.load_weights(self._weights)

    def _gather(self, grads: dict[str, np.ndarray]) -> np.ndarray | None:
        try:
            return self.trainer.gather(grads, out=np.zeros(self.trainer.params.size, np.float32))
        except Refusal as exc:
            self._refuse(exc)
            return None

    def _step(self, step: Callable[[Any], dict[str, np.ndarray]], grads: Any) -> dict[str, np.ndarray]:
        """The new weights of ``step(grads)``, or the current ones if a shard would refuse it (as the fleet's,
        logged)."""
        try:
            weights = step(grads)
        except Refusal as exc:
            self._refuse(exc)
            return self._weights
        self.updates += 1
        return weights

    def _refuse(self, exc: Refusal) -> None:
        self.refused += 1
        log.warning("serial: gradients refused (%s), nothing applied", ": ".join(map(str, exc.args)))

    def weights(self) -> dict[str, np.ndarray]:
        return dict(self._weights)

    def state(self) -> dict[str, object]:
        """The optimizer's step count, for the serial run's checkpoint."""
        assert self.trainer.optimizer is not None
        return {"optimizer_steps": self.trainer.optimizer.steps}

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()
