"""PPO (Schulman et al. 2017) on the fleet: DPPO on the barrier, APPO async.

The folder: :mod:`.config` (the ``algorithm:`` section), :mod:`.networks`
(separate actor and critic MLPs, the Gaussian log-std, observation
normalisation), :mod:`.policy` (numpy acting: Categorical or diagonal
Gaussian), :mod:`.segments` (the adder: T-step trajectory segments),
:mod:`.losses` (GAE and the loss pieces) and :mod:`.learner` (epochs x
minibatches over a batch of segments).

What the fleet runs of it is its Builder (:mod:`.builder`); this module stays torch-free.
"""

from rlfleet.common.algorithms.ppo.builder import BUILDER

__all__ = ["BUILDER"]
