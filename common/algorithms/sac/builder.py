"""The SAC Builder: what the fleet needs to run soft actor-critic (common/algorithms/builder.py).

Torch-free: the registry and the config read it; what it names is imported when made.
"""

from __future__ import annotations

from rlfleet.common.algorithms import spaces
from rlfleet.common.algorithms.adders import config_transitions
from rlfleet.common.algorithms.builder import Builder
from rlfleet.common.algorithms.sac.config import SACConfig

BUILDER = Builder(
    name="sac",
    config=SACConfig,
    check_env=spaces.continuous_control,
    make_adder=config_transitions,  # n-step transitions (cfg.n_step, cfg.gamma)
    policy="rlfleet.common.algorithms.sac.policy:SACPolicy",
    learner="rlfleet.common.algorithms.sac.learner:SACLearner",
)
