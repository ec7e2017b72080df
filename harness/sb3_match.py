"""What the tests that match our algorithms against Stable-Baselines3's share: an env of spaces only, the
SB3 MlpPolicy modules of our actor-critic networks, and copying our weights into SB3's policy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

# SB3 MlpPolicy module -> our network's module: separate 64x64 tanh policy and value torsos
A3C_MODULES = {"mlp_extractor.policy_net.0": "torso.0", "mlp_extractor.policy_net.2": "torso.2",
               "action_net": "pi", "mlp_extractor.value_net.0": "v_torso.0",
               "mlp_extractor.value_net.2": "v_torso.2", "value_net": "v"}
PPO_MODULES = {"mlp_extractor.policy_net.0": "actor.0", "mlp_extractor.policy_net.2": "actor.2",
               "action_net": "actor.4", "mlp_extractor.value_net.0": "critic.0",
               "mlp_extractor.value_net.2": "critic.2", "value_net": "critic.4"}


class Still(gym.Env[np.ndarray, int]):
    """LunarLander's spaces only: SB3 needs an env to build its model; a test makes up the rollouts."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)
    action_space = gym.spaces.Discrete(4)  # type: ignore[assignment]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(8, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(8, np.float32), 0.0, False, False, {}


def copy_into_sb3(policy: torch.nn.Module, weights: Mapping[str, np.ndarray], modules: Mapping[str, str]) -> None:
    """Our published ``weights`` into SB3's ``policy``, module by module (``modules``: SB3's name -> ours)."""
    with torch.no_grad():
        for module, name in modules.items():
            layer: Any = policy.get_submodule(module)
            layer.weight.copy_(torch.as_tensor(weights[f"{name}.weight"]))
            layer.bias.copy_(torch.as_tensor(weights[f"{name}.bias"]))
