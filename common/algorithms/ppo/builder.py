"""The PPO Builder: what the fleet needs to run DPPO (barrier) and APPO (async) (common/algorithms/builder.py).

Torch-free: the registry and the config read it; what it names is imported when made.
"""

from __future__ import annotations

from typing import Any

from rlfleet.common.algorithms import spaces
from rlfleet.common.algorithms.adders import segment_adder
from rlfleet.common.algorithms.builder import Builder
from rlfleet.common.algorithms.contract import EnvMismatch
from rlfleet.common.algorithms.ppo.config import PPOConfig
from rlfleet.common.algorithms.torsos import choose_torso

ALLOWED = "Discrete (starting at 0), or Box with finite low and high"
EXTRAS = {"logp": ("float32", ()), "value": ("float32", ())}  # the policy's extras the learner reads


def check_env(cfg: PPOConfig, observation_space: Any, action_space: Any, env_id: str | None = None) -> None:
    env = spaces.env_label(env_id)
    if spaces.is_discrete(action_space):
        spaces.discrete_from_zero(cfg.name, env, action_space, ALLOWED)
    else:
        spaces.bounded_box(cfg.name, env, action_space, "clips actions to the action space's bounds", ALLOWED)
    spaces.box_observations(cfg.name, env, observation_space)
    if choose_torso(cfg.torso, observation_space, cfg.name, env) == "nature_cnn" and cfg.obs_norm:
        raise EnvMismatch(f"algorithm {cfg.name}: obs_norm normalises flat observations; {env} gives images, which"
                          " the CNN scales to [0, 1] on the learner's device; allowed for images: obs_norm false")


BUILDER = Builder(
    name="ppo",
    config=PPOConfig,
    check_env=check_env,
    make_adder=lambda cfg, num_envs, obs, act, mode: segment_adder(cfg.segment_length, num_envs, obs, act, mode,
                                                                   EXTRAS),
    policy="rlfleet.common.algorithms.ppo.policy:PPOPolicy",
    learner="rlfleet.common.algorithms.ppo.learner:PPOLearner",
    autoreset_mode="SameStep",  # segments of every slot end on the same vector step: a barrier round's end
)
