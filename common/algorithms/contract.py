"""The algorithm contract: what every algorithm gives the services, and nothing else.

An algorithm's :class:`~rlfleet.common.algorithms.builder.Builder` makes these objects; the learner
side shares one base (:class:`~rlfleet.common.algorithms.learning.LearnerBase`).

In the manner of RLlib's new stack (an RLModule with an inference and an
exploration forward; a Learner that splits compute and apply) and Acme's
builder (adders between the env loop and replay). The services never test an
algorithm's name: they ask these objects.

Acting (actors and evaluators; CPU; numpy in and out)::

    policy = algo.make_policy(cfg, obs_space, act_space, device="cpu", seed=exp_seed, act_seed=[...])
    policy.load_weights(weights)                      # from the paramserver
    figures = policy.explore(index, num_actors, fleet_env_steps)   # actors only; evaluators never
    actions, extras = policy.act(obs)                 # evaluators: act(obs, deterministic=True)
    items = adder.add(actions, extras, next_obs, rewards, terminated, truncated, infos, version)
    priorities = policy.priorities(items)             # None: the table needs none

Learning (the learner service)::

    learner = algo.make_learner(cfg, obs_space, act_space, device=..., seed=exp_seed, averager=None)
    learner.data                                      # DataSpec: how to sample for it
    batch = sample(learner.data.batch_items)          # replay knows no algorithm's knobs
    weights = learner.weigh(batch.probability)        # importance weights, None: unweighted
    batch, weights, stale, invalid = drop_stale(batch.data, version, learner.data.max_staleness, weights)
    metrics, priorities = learner.learn(batch, weights)    # built from compute_gradients + apply_gradients
    publish(learner.weights())                        # named float arrays, only what acting needs
    learner.load_weights(weights)                     # a learner starting from the fleet's newest weights

Nothing here imports torch or gymnasium at run time: the config (and so the
replay and paramserver images) read the registry without them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

if TYPE_CHECKING:
    pass

Columns = dict[str, np.ndarray]
ColumnSchema = dict[str, tuple[str, tuple[int, ...]]]  # column -> (dtype name, per-item shape)
Grads = dict[str, list[Any]]  # optimizer name -> one tensor (or None) per parameter of that optimizer
SeedLike = int | Sequence[int] | None


class EnvMismatch(ValueError):
    """The env's spaces do not fit the algorithm (e.g. DQN on continuous actions)."""


class UnknownAlgorithm(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class Policy(Protocol):
    """Acting side: lives in every actor and evaluator, fed weights from the paramserver."""

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Copy in published weights; all checked (names, shapes) before any is copied."""
        ...

    def explore(self, actor_index: int, num_actors: int, fleet_env_steps: int) -> dict[str, float]:
        """Update the policy's own exploration state; return figures for metrics (e.g. {"epsilon": 0.05}).

        The actor calls it on start, at heartbeats and while a schedule runs; evaluators never do.
        """
        ...

    def act(self, obs: np.ndarray, *, deterministic: bool = False) -> tuple[np.ndarray, Columns]:
        """Actions for a batch of observations (int64[B] or float32[B, ...], within the env's
        bounds) and the extras the learner needs, one row per observation."""
        ...

    def priorities(self, items: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """Initial priorities (float64[items]) of items about to be inserted, or None."""
        ...


class Adder(Protocol):
    """Turns vector-env steps into the items an actor inserts (n-step transitions, segments, ...).

    Every item has a ``version`` column (int64): the weights version it was acted with.
    """

    def reset(self, obs: np.ndarray) -> None: ...

    def add(
        self,
        actions: np.ndarray,
        extras: Mapping[str, np.ndarray],
        next_obs: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        infos: Mapping[str, Any] | None,
        version: int,
    ) -> Columns:
        """Record one vector step; return the items it completes (possibly zero rows)."""
        ...

    def schema(self) -> ColumnSchema:
        """Every column of the items ``add`` returns, with its dtype and per-item shape.

        Replay fixes the learner's table to it at start (numpy and gymnasium only: the
        replay image has no torch), so an insert of anything else is refused before it
        can reach the learner."""
        ...


@dataclass(frozen=True)
class DataSpec:
    """How a learner consumes data; the learner service samples accordingly.

    - ``table_kinds``: replay table kinds it can learn from.
    - ``batch_items``: items per sample request (transitions for DQN, segments for async PPO).
    - ``returns_priorities``: learn() returns new priorities to write back.
    - ``max_staleness``: items acted with weights more than this many versions old are dropped
      (:func:`drop_stale`) before learn; None: no limit.
    - ``round``: how a barrier round is consumed (:mod:`rlfleet.common.algorithms.rounds`). ``"updates"``:
      ``updates_per_round`` calls of learn, each on a fresh sample of ``batch_items`` (DQN, SAC; the
      count is the learner config's). ``"every_item"``: every item the round's actors inserted, once,
      in one learn call (PPO's segments).
    - ``item_steps``: env steps of one env slot that one item covers (1 for a transition, T for a
      segment).
    """

    table_kinds: tuple[str, ...]
    batch_items: int
    returns_priorities: bool
    max_staleness: int | None = None
    round: Literal["updates", "every_item"] = "updates"
    item_steps: int = 1  # env steps of one env slot an item covers (a segment: its length)


class Learner(Protocol):
    """Training side: lives in the learner service; no sockets."""

    data: DataSpec
    num_updates: int  # optimizer steps taken
    device: Any  # torch.device the learner trains on

    def weigh(self, probability: np.ndarray) -> np.ndarray | None:
        """Importance weights (float32, one per item) for a batch sampled with these probabilities
        (replay's ``probability`` column), with the algorithm's exponent now (prioritized replay:
        :func:`~rlfleet.common.algorithms.importance.importance_weights`); None: learn unweighted."""
        ...

    def compute_gradients(
        self, batch: Mapping[str, Any], weights: Any = None
    ) -> tuple[Grads, dict[str, float], np.ndarray | None]:
        """Gradients of the loss on ``batch`` (autograd), its figures, and new priorities or None."""
        ...

    def apply_gradients(self, grads: Grads) -> None:
        """Clip, step the optimizers, follow target networks, count the update."""
        ...

    def learn(self, batch: Mapping[str, Any], weights: Any = None) -> tuple[dict[str, float], np.ndarray | None]:
        """One full update on one sampled batch, built from compute_gradients and apply_gradients."""
        ...

    def weights(self) -> dict[str, np.ndarray]:
        """CPU float32 copies of what acting needs, as named arrays, to publish."""
        ...

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Start from published weights (what :meth:`weights` gives, e.g. the paramserver's newest):
        the networks they hold take them, targets follow; what is not published (critics, optimizer
        moments, counters) stays as it is. All checked (names, shapes) before any is copied:
        ValueError for weights of another network."""
        ...

    def resume_env_steps(self, env_steps: int) -> None:
        """The fleet's env steps so far, for a learner that starts with no checkpoint of its own: what
        runs on env steps (PPO's annealing) goes on from there; counters of updates cannot be recovered."""
        ...

    def state(self) -> dict[str, Any]:
        """A checkpoint of plain tensors, dicts, lists and numbers (loads with weights_only=True)."""
        ...

    def load_state(self, state: Mapping[str, Any]) -> None: ...


class GradientWorker(Policy, Protocol):
    """A policy that also computes gradients on its own experience (A3C, HogWild): the actor
    service runs as a gradient worker, and the paramserver's shards apply what it pushes."""

    def weights(self) -> dict[str, np.ndarray]:
        """The whole model as the worker holds it: from the experiment seed before any weights were loaded
        (version 0, published by the first worker), and what a worker publishes to a paramserver that
        restarted with none."""
        ...

    def gradients(self, items: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray] | None, dict[str, float]]:
        """float32 gradients named like the published weights, computed on ``items`` (what the adder
        returned; a worker may keep them and compute on a batch of what it kept) against the weights
        loaded last, and the loss's figures; None while it has nothing to push yet."""
        ...


def drop_stale(
    batch: Mapping[str, np.ndarray], current_version: int, max_staleness: int | None,
    weights: np.ndarray | None = None,
) -> tuple[Columns, np.ndarray | None, int, int]:
    """Keep the items acted with weights at most ``max_staleness`` versions older than ``current_version``.

    Returns the kept rows of every column, the kept rows of ``weights`` (per-item importance
    weights, None stays None), how many items were dropped as stale and how many as invalid: a
    version below 0 or above ``current_version`` (the newest the learner published) is one no
    actor acted with, whatever ``max_staleness`` (None: no limit on staleness). Items need a
    ``version`` column (int64, one per item) unless ``max_staleness`` is None.
    """
    columns = dict(batch)
    if "version" not in columns:
        if max_staleness is None:
            return columns, weights, 0, 0
        raise KeyError("batch has no 'version' column; every item carries the weights version it was acted with")
    versions = np.asarray(columns["version"]).reshape(-1)
    keep = (versions >= 0) & (versions <= current_version)
    invalid = int(keep.size - np.count_nonzero(keep))
    if max_staleness is not None:
        keep &= versions >= current_version - max_staleness
    dropped = int(keep.size - np.count_nonzero(keep))
    if dropped == 0:
        return columns, weights, 0, 0
    kept_weights = None if weights is None else np.asarray(weights)[keep]
    return ({key: np.asarray(value)[keep] for key, value in columns.items()}, kept_weights, dropped - invalid,
            invalid)
