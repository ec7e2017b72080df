"""Soft actor-critic (Haarnoja et al. 2018) on the fleet, for Box actions.

The folder: :mod:`.config` (the ``algorithm:`` section), :mod:`.networks` (the
tanh-Gaussian actor, twin critics, action scaling), :mod:`.policy` (numpy acting,
random warm-up), :mod:`.learner` (critics, actor and temperature from one sampled
batch) and the shared n-step adder (:mod:`rlfleet.common.algorithms.adders.nstep`) carrying
float actions. Only the actor is published.

What the fleet runs of it is its Builder (:mod:`.builder`); this module stays torch-free.
"""

from rlfleet.common.algorithms.sac.builder import BUILDER

__all__ = ["BUILDER"]
