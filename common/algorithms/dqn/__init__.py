"""Ape-X DQN: double Q, dueling heads, n-step returns, prioritized replay.

Horgan et al. 2018, "Distributed Prioritized Experience Replay". The folder:
:mod:`.config` (the ``algorithm:`` section), :mod:`.networks` (the Q-network and
its numpy acting path), :mod:`.policy` (epsilon-greedy acting with the Ape-X
schedule, initial priorities), :mod:`.learner` (the update), :mod:`.worker`
(``hogwild: true``: the same loss computed by each actor on its own buffer) and
the shared n-step adder (:mod:`rlfleet.common.algorithms.adders.nstep`).

What the fleet runs of it is its Builder (:mod:`.builder`); this module stays torch-free.
"""

from rlfleet.common.algorithms.dqn.builder import BUILDER

__all__ = ["BUILDER"]
