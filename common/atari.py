"""Atari through ale-py, with the standard preprocessing (``env.atari`` in the experiment file).

The order is SB3's and CleanRL's: the emulator at one frame per step, no-op
starts, frame skip with a max over the last two frames, 84x84 grayscale
(gymnasium's AtariPreprocessing, uint8, never scaled), then for training
only episodic life and reward clipping, FIRE after resets in games that
need it, and a stack of the last frames (stack axis first). Observations
stay uint8 from here to the learner's device.

Evaluations (``training=False``) play whole games and score unclipped rewards.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.common.config import AtariConfig

ATARI_PREFIX = "ALE/"


class AtariEnvError(ValueError):
    """An Atari id that cannot be made (ale-py missing, an unknown game, a ROM not shipped)."""


def is_atari(env_id: str) -> bool:
    return env_id.startswith(ATARI_PREFIX)


def register() -> None:
    """Register ale-py's ``ALE/...`` ids with gymnasium (gymnasium 1.x loads no plugins itself)."""
    try:
        import ale_py
    except ImportError as exc:
        raise AtariEnvError(f"Atari ids need the ale-py package ({exc}); install the project with its dependencies"
                            ) from None
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner per env in every service's log
    gym.register_envs(ale_py)


def rom_ids() -> list[str]:
    """Every game whose ROM this ale-py ships (``pong``, ``breakout``, ...)."""
    from ale_py import roms

    return sorted(roms.get_all_rom_ids())


class EpisodicLife(gym.Wrapper):  # type: ignore[type-arg]
    """A lost life ends the episode for learning; the game only restarts when it is really over."""

    def __init__(self, env: gym.Env) -> None:  # type: ignore[type-arg]
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> Any:
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:  # the game goes on: one no-op step past the lost life
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        return obs, info


class FireReset(gym.Wrapper):  # type: ignore[type-arg]
    """Press FIRE (then one more action) after a reset: some games do not start without it."""

    def reset(self, **kwargs: Any) -> Any:
        self.env.reset(**kwargs)
        obs: Any = None
        info: dict[str, Any] = {}
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class ClipReward(gym.RewardWrapper):  # type: ignore[type-arg]
    def reward(self, reward: Any) -> float:
        return float(np.sign(reward))


def make_atari(env_id: str, cfg: AtariConfig, kwargs: dict[str, Any], max_episode_steps: int | None,
               training: bool) -> gym.Env:  # type: ignore[type-arg]
    """One preprocessed Atari env: uint8 observations of shape (frame_stack, screen_size, screen_size)."""
    register()
    if "frameskip" in kwargs:
        raise AtariEnvError(f"env.kwargs.frameskip={kwargs['frameskip']!r}: the preprocessing skips frames; "
                            "set env.atari.frame_skip instead")
    kw = {**kwargs, "frameskip": 1}  # ALE's own sticky actions (repeat_action_probability) stay as configured
    if max_episode_steps:
        kw["max_episode_steps"] = max_episode_steps
    try:
        env: gym.Env = gym.make(env_id, **kw)  # type: ignore[type-arg]
    except gym.error.Error as exc:
        raise AtariEnvError(f"env.id={env_id!r}: {exc}; ale-py ships the ROMs of: {', '.join(rom_ids())} "
                            f"(as ALE/<Name>-v5, e.g. ALE/Pong-v5)") from None
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=cfg.noop_max, frame_skip=cfg.frame_skip, screen_size=cfg.screen_size,
        terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    if training and cfg.terminal_on_life_loss:
        env = EpisodicLife(env)
    if cfg.fire_reset and "FIRE" in env.unwrapped.get_action_meanings():  # type: ignore[attr-defined]
        env = FireReset(env)
    if training and cfg.clip_rewards:
        env = ClipReward(env)
    return gym.wrappers.FrameStackObservation(env, cfg.frame_stack)
