"""Twin delayed DDPG (TD3; Fujimoto et al. 2018) on the fleet, for Box actions.

The folder: :mod:`.config` (the ``algorithm:`` section), :mod:`.networks` (the deterministic
tanh actor, twin critics and their targets), :mod:`.policy` (numpy acting with Gaussian
exploration noise, random warm-up), :mod:`.learner` (clipped double-Q critics every update;
the actor and the Polyak targets every ``policy_delay``-th) and the shared n-step adder
(:mod:`rlfleet.common.algorithms.adders.nstep`) carrying float actions. Only the actor is published.

What the fleet runs of it is its Builder (:mod:`.builder`); this module stays torch-free.
"""

from rlfleet.common.algorithms.td3.builder import BUILDER

__all__ = ["BUILDER"]
