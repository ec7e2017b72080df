"""Which torso a network gets (torch-free: the config and the env check read it).

``torso: auto`` picks the Nature CNN (:mod:`rlfleet.common.algorithms.cnn`) for image
observations (uint8 boxes of shape [stack, height, width]) and an MLP for
everything else; a torso that does not fit the observations is refused with
what was given and what is allowed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlfleet.common.algorithms.contract import EnvMismatch

MIN_IMAGE_SIDE = 36  # the Nature CNN's three convolutions need at least this many pixels a side


def is_image_space(space: Any) -> bool:
    """A uint8 Box of 3 dims: frames stacked on the first axis (channels first), as the Atari envs give."""
    import gymnasium as gym

    return (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and space.shape is not None
            and len(space.shape) == 3)


def choose_torso(torso: str, observation_space: Any, algorithm: str, env: str) -> str:
    """``mlp`` or ``nature_cnn`` for ``observation_space``, or EnvMismatch naming the misfit."""
    image = is_image_space(observation_space)
    if torso == "auto":
        torso = "nature_cnn" if image else "mlp"
    if torso == "mlp" and image:
        raise EnvMismatch(
            f"algorithm {algorithm}: {env} gives images ({observation_space}) and torso=mlp flattens them into an "
            f"MLP; allowed for images: torso auto or nature_cnn")
    if torso == "nature_cnn":
        if not image:
            raise EnvMismatch(
                f"algorithm {algorithm}: torso=nature_cnn needs image observations (uint8 [stack, height, width]); "
                f"{env} has {observation_space}; allowed: torso auto or mlp")
        side = min(observation_space.shape[1:])
        if side < MIN_IMAGE_SIDE:
            raise EnvMismatch(f"algorithm {algorithm}: torso=nature_cnn needs frames of at least {MIN_IMAGE_SIDE}"
                              f" pixels a side; {env} gives {list(observation_space.shape)}")
    return torso
