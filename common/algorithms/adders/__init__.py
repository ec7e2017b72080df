"""Adders: vector-env steps into the items actors insert (:mod:`.nstep` transitions, :mod:`.segments`
trajectory segments), and the factories builders make them with for an env's spaces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfleet.common.algorithms.contract import EnvMismatch

if TYPE_CHECKING:  # gymnasium is imported when an adder is made, not with the registry (rlfleet config, replay)
    from rlfleet.common.algorithms.adders.nstep import NStepAdder
    from rlfleet.common.algorithms.adders.segments import SegmentAdder


def transition_adder(n_step: int, gamma: float, num_envs: int, observation_space: Any, action_space: Any,
                     autoreset_mode: Any) -> NStepAdder:
    """The n-step adder of transitions for these spaces: int64 actions for Discrete, float32 for Box;
    observations stored as the env gives them (uint8 frames stay uint8)."""
    from rlfleet.common.algorithms.adders.nstep import NStepAdder
    from rlfleet.common.algorithms.adders.vector_steps import stored_obs_dtype

    if observation_space.shape is None or action_space.shape is None:
        raise EnvMismatch(f"spaces {observation_space}, {action_space} need shapes")
    actions: dict[str, Any] = {} if action_space.dtype.kind in "iu" and action_space.shape == () else {
        "action_shape": tuple(action_space.shape), "action_dtype": np.float32}
    return NStepAdder(num_envs, n_step, gamma, tuple(observation_space.shape), autoreset_mode,
                      obs_dtype=stored_obs_dtype(observation_space), **actions)


def config_transitions(cfg: Any, num_envs: int, observation_space: Any, action_space: Any,
                       autoreset_mode: Any) -> NStepAdder:
    """A Builder's adder for a config with ``n_step`` and ``gamma``: :func:`transition_adder`."""
    return transition_adder(cfg.n_step, cfg.gamma, num_envs, observation_space, action_space, autoreset_mode)


def segment_adder(length: int, num_envs: int, observation_space: Any, action_space: Any, autoreset_mode: Any,
                  extras: Mapping[str, tuple[str, tuple[int, ...]]] | None = None) -> SegmentAdder:
    """The adder of fixed-length trajectory segments (with the policy's ``extras`` columns)."""
    from rlfleet.common.algorithms.adders.segments import SegmentAdder

    return SegmentAdder(num_envs, length, observation_space, action_space, autoreset_mode, extras or {})
