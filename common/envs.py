"""Environments: gymnasium ids or custom ``module:Class``, vectorized, optionally slowed.

``env.step_latency_ms`` wraps every env with a fixed per-step delay: what a
remote simulator, a game server or a robot costs. It is how the scaling
benchmark makes actors latency-bound, as real simulators are.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import concatenate, iterate

from rlfleet.common import algorithms, atari
from rlfleet.common.algorithms.values import ValueRules, value_rules
from rlfleet.common.config import EnvConfig, Experiment

log = logging.getLogger("rlfleet.envs")


class EnvError(ValueError):
    """The configured env cannot be made, or does not fit the algorithm."""


class StepLatency(gym.Wrapper):  # type: ignore[type-arg]
    """Sleeps a fixed time on every step, like a remote simulator would."""

    def __init__(self, env: gym.Env, latency_ms: float) -> None:  # type: ignore[type-arg]
        super().__init__(env)
        self.latency_s = latency_ms / 1000.0

    def step(self, action: Any) -> Any:
        time.sleep(self.latency_s)
        return self.env.step(action)


def import_module(name: str, what: str) -> Any:
    """Import ``name``; an EnvError naming it, where Python looked and how to fix it when it fails."""
    import sys

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        where = [p or "(the working directory)" for p in sys.path]
        raise EnvError(f"{what}: cannot import module {name!r} ({exc}). Looked in sys.path: {where}. Fix: run "
                       "rlfleet from the directory that holds it, add that directory to PYTHONPATH, or install "
                       "its package (pip install -e .); in a container, copy it into the image "
                       "(docs/custom_envs.md)") from None
    except Exception as exc:  # the module itself failed: its own error, without rlfleet's traceback
        raise EnvError(f"{what}: importing module {name!r} failed: {type(exc).__name__}: {exc}") from None


def import_env_modules(cfg: EnvConfig) -> None:
    """Import ``env.imports`` (their gymnasium.register calls run) before the id is resolved."""
    for name in cfg.imports:
        import_module(name, f"env.imports {name!r}")


def custom_env_class(env_id: str) -> Callable[..., gym.Env] | None:  # type: ignore[type-arg]
    """``module:Class`` (a gymnasium.Env subclass) or ``module:function`` (returns an Env), or None for a
    registered id (gymnasium's own ``module:EnvId-v0``: the import registers it)."""
    if ":" not in env_id:
        return None
    module_name, attr = env_id.split(":", 1)
    module = import_module(module_name, f"env.id={env_id!r}")
    obj = getattr(module, attr, None)
    if isinstance(obj, type) and issubclass(obj, gym.Env):
        return obj
    if callable(obj) and not isinstance(obj, type):
        return obj  # type: ignore[no-any-return]
    if obj is not None:
        raise EnvError(f"env.id={env_id!r}: {module_name}.{attr} is a {type(obj).__name__}; allowed: a "
                       "gymnasium.Env subclass or a function returning an Env")
    return None


def env_factory(cfg: EnvConfig, training: bool = True) -> Callable[[], gym.Env]:  # type: ignore[type-arg]
    """A thunk that makes one env as configured (render_mode None: no rendering cost).

    ``training`` False: an evaluation's env (Atari: whole games, real rewards; see common/atari.py)."""
    import_env_modules(cfg)
    cls = custom_env_class(cfg.id)
    warned: list[bool] = []

    def make() -> gym.Env:  # type: ignore[type-arg]
        env: gym.Env  # type: ignore[type-arg]
        if atari.is_atari(cfg.id):
            try:
                env = atari.make_atari(cfg.id, cfg.atari, cfg.kwargs, cfg.max_episode_steps, training)
            except atari.AtariEnvError as exc:
                raise EnvError(str(exc)) from None
        elif cls is not None:
            env = cls(**cfg.kwargs)
            if not isinstance(env, gym.Env):
                raise EnvError(f"env.id={cfg.id!r} returned a {type(env).__name__}; allowed: a gymnasium.Env")
            if cfg.max_episode_steps:
                env = gym.wrappers.TimeLimit(env, cfg.max_episode_steps)
            elif not warned and not has_time_limit(env):
                warned.append(True)
                log.warning("env.id=%r has no time limit: its episodes end only when the env ends them, so "
                            "an evaluation of a policy that never fails never ends; set env.max_episode_steps "
                            "(or return a TimeLimit-wrapped env)", cfg.id)
        else:
            kw = dict(cfg.kwargs)
            if cfg.max_episode_steps:
                kw["max_episode_steps"] = cfg.max_episode_steps
            env = gym.make(cfg.id, **kw)
        if cfg.step_latency_ms > 0:
            env = StepLatency(env, cfg.step_latency_ms)
        return env

    return make


def has_time_limit(env: gym.Env) -> bool:  # type: ignore[type-arg]
    """Whether a TimeLimit wraps ``env`` anywhere in its chain of wrappers."""
    while True:
        if isinstance(env, gym.wrappers.TimeLimit):
            return True
        inner = getattr(env, "env", None)
        if not isinstance(inner, gym.Env) or inner is env:
            return False
        env = inner


class ThreadVectorEnv(SyncVectorEnv):
    """A SyncVectorEnv whose envs step at the same time, one thread each (NEXT_STEP or SAME_STEP autoreset).

    For envs whose step waits rather than computes (a remote simulator, a game server, a
    robot: ``env.step_latency_ms``): the waits overlap as with ``async``, without a process,
    a pipe and a pickled message per env and step. Envs that compute in Python hold the GIL
    and gain nothing.
    """

    def __init__(self, env_fns: list[Callable[[], gym.Env]],  # type: ignore[type-arg]
                 autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP) -> None:
        super().__init__(env_fns, autoreset_mode=autoreset_mode)
        self._pool = ThreadPoolExecutor(max_workers=self.num_envs, thread_name_prefix="env")

    def _step_one(self, i: int, action: Any) -> tuple[Any, ...]:
        if self.autoreset_mode is AutoresetMode.NEXT_STEP:
            if self._autoreset_envs[i]:
                obs, info = self.envs[i].reset()
                return obs, 0.0, False, False, info
            return self.envs[i].step(action)  # type: ignore[no-any-return]
        obs, reward, terminated, truncated, info = self.envs[i].step(action)
        if terminated or truncated:  # SAME_STEP: reset now, the final observation goes in the infos
            final_obs, final_info = obs, info
            obs, info = self.envs[i].reset()
            info = {**info, "final_obs": final_obs, "final_info": final_info}
        return obs, reward, terminated, truncated, info

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        results = list(self._pool.map(self._step_one, range(self.num_envs), iterate(self.action_space, actions)))
        infos: dict[str, Any] = {}
        for i, (obs, reward, terminated, truncated, info) in enumerate(results):
            self._env_obs[i] = obs
            self._rewards[i], self._terminations[i], self._truncations[i] = reward, terminated, truncated
            infos = self._add_info(infos, info, i)
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (self._observations.copy() if self.copy else self._observations, np.copy(self._rewards),  # type: ignore[attr-defined]
                np.copy(self._terminations), np.copy(self._truncations), infos)

    def close_extras(self, **kwargs: Any) -> None:
        self._pool.shutdown(wait=True)
        super().close_extras(**kwargs)


def make_vector_env(cfg: EnvConfig, seed: int,  # type: ignore[type-arg]
                    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, training: bool = True) -> VectorEnv:
    """``cfg.num_envs`` envs as one vector env, reset with seeds seed..seed+n-1 by the caller.

    ``autoreset_mode`` is the algorithm's (``Builder.autoreset_mode``): NEXT_STEP spends a
    vector step on each reset; SAME_STEP resets within the ending step, so every vector step is an
    env step of every slot (what fixed-length segments aligned to barrier rounds need).
    """
    mode = AutoresetMode(autoreset_mode)
    thunks = [env_factory(cfg)] * cfg.num_envs
    if cfg.vectorization == "async":
        return AsyncVectorEnv(thunks, autoreset_mode=mode)
    if cfg.vectorization == "threads":
        return ThreadVectorEnv(thunks, autoreset_mode=mode)
    return SyncVectorEnv(thunks, autoreset_mode=mode)


def probe_env(cfg: Experiment) -> tuple[gym.Space, gym.Space]:  # type: ignore[type-arg]
    """Make the env once: its spaces, or an EnvError naming what does not fit."""
    try:
        env = env_factory(cfg.env)()
    except EnvError:
        raise
    except gym.error.Error as exc:
        raise EnvError(f"env.id={cfg.env.id!r}: {exc}") from None
    except Exception as exc:
        raise EnvError(f"env.id={cfg.env.id!r} could not be made: {type(exc).__name__}: {exc}") from None
    try:
        spaces = env.observation_space, env.action_space
    finally:
        env.close()
    try:
        algorithms.check_env(cfg.algorithm, spaces[0], spaces[1], cfg.env.id)
    except algorithms.EnvMismatch as exc:
        raise EnvError(str(exc)) from None
    return spaces


def experience_schema(cfg: Experiment) -> algorithms.ColumnSchema:
    """The columns actors insert for this config (its algorithm's adder on its env's spaces)."""
    return experience_spec(cfg)[0]


def experience_spec(cfg: Experiment) -> tuple[algorithms.ColumnSchema, ValueRules]:
    """The columns actors insert for this config, and the values each may hold (common/algorithms/values.py)."""
    obs_space, act_space = probe_env(cfg)
    algo = algorithms.get(cfg.algorithm.name)
    schema = algo.make_adder(cfg.algorithm, 1, obs_space, act_space, algo.autoreset_mode).schema()
    return schema, value_rules(schema, act_space)


def acting_policy(cfg: Experiment, act_seed: int | Sequence[int] | None = None) -> algorithms.Policy:
    """The CPU acting policy actors, the evaluator and `rlfleet eval` build.

    Its starting weights come from the experiment seed (the learner's too); ``act_seed`` seeds its own
    sampling (an actor's: the experiment seed and its index).
    """
    obs_space, act_space = probe_env(cfg)
    return algorithms.get(cfg.algorithm.name).make_policy(cfg.algorithm, obs_space, act_space, device="cpu",
                                                          seed=cfg.seed, act_seed=act_seed)
