"""The TD3 Builder: what the fleet needs to run twin delayed DDPG (common/algorithms/builder.py).

Torch-free: the registry and the config read it; what it names is imported when made.
"""

from __future__ import annotations

from rlfleet.common.algorithms import spaces
from rlfleet.common.algorithms.adders import config_transitions
from rlfleet.common.algorithms.builder import Builder
from rlfleet.common.algorithms.td3.config import TD3Config

BUILDER = Builder(
    name="td3",
    config=TD3Config,
    check_env=spaces.continuous_control,
    make_adder=config_transitions,  # n-step transitions (cfg.n_step, cfg.gamma)
    policy="rlfleet.common.algorithms.td3.policy:TD3Policy",
    learner="rlfleet.common.algorithms.td3.learner:TD3Learner",
)
