"""A3C (Mnih et al. 2016) on the fleet: gradient workers and the paramserver's shard optimizers.

No replay and no learner process: every actor is a gradient worker (services/actor/worker.py)
that acts with the weights it pulled, computes the n-step advantage actor-critic gradient on its
own rollouts (:mod:`.worker`) and pushes it; each paramserver shard applies its slice with its
own optimizer (``paramserver.gradients``) and publishes the result as the next version. The
folder: :mod:`.config`, :mod:`.networks` (shared torso, policy and value heads), :mod:`.policy`
(numpy acting, also the evaluator's), :mod:`.worker` (the loss and its gradient).

What the fleet runs of it is its Builder (:mod:`.builder`); this module stays torch-free.
"""

from rlfleet.common.algorithms.a3c.builder import BUILDER

__all__ = ["BUILDER"]
