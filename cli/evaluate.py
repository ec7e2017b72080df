"""`rlfleet eval RUN_DIR` or `rlfleet eval --checkpoint PATH`: score a run's weights with no service running.

Which weights of a run directory (``--which``): ``best`` (the default) is RUN_DIR/evaluator/best.pt,
the weights of the run's best evaluation as the evaluator kept them, and ``latest`` the newest a run
holds; either falls back to the other when the run has only one. The newest is the learner's
checkpoint (RUN_DIR/learner/checkpoint.pt) or, for runs trained by gradient workers (no learner), the
paramserver's snapshot: every RUN_DIR/paramserver/shard-N.npz, assembled with the run's
RUN_DIR/config.yaml. ``--checkpoint`` takes any one of these files. The command says which it scored.

The experiment config travels inside the checkpoint. Evaluation is the
evaluator's own code path (``rlfleet.services.actor.evaluator.evaluate``) with its
defaults: ``evaluator.episodes`` episodes acted deterministically, seeds from
``seed + EVAL_SEED_OFFSET``; so the mean matches what the evaluator reported
for the same weights. ``--video out.gif`` also records the first of those
episodes (same seed) as an animated GIF.

Which weights: a checkpoint that holds ``weights`` (the arrays of the published
``version``, what actors and the evaluator received) is scored with those; an
older one is scored with the learner's online net, which can be a few updates
past ``version``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import yaml

from rlfleet.common import algorithms
from rlfleet.common import config as config_mod
from rlfleet.common.config import Experiment


class CheckpointError(ValueError):
    """Not a learner checkpoint, or one whose config no longer validates."""


@dataclass
class Loaded:
    cfg: Experiment
    version: int
    updates: int
    weights: dict[str, np.ndarray]
    exact: bool  # True: the published version's own arrays; False: the online net at checkpoint time


def load_for_eval(path: str | Path) -> Loaded:
    """Config, version and acting weights of a learner checkpoint (weights_only load)."""
    from rlfleet.common.algorithms.checkpoint import load_checkpoint  # torch: not in the replay/paramserver images

    try:
        state = load_checkpoint(path)
    except Exception as exc:  # torch refuses non-weights content, truncated files, ...
        raise CheckpointError(f"{path}: cannot be read as a checkpoint ({type(exc).__name__}: {exc})") from None
    if state is None:
        raise CheckpointError(f"{path}: no such file")
    if not {"core", "version", "config"} <= set(state):
        raise CheckpointError(f"{path}: not an rlfleet learner checkpoint (needs core, version, config; "
                              f"has {sorted(state)})")
    try:
        cfg = config_mod.validate(yaml.safe_load(state["config"]) or {})
    except (config_mod.ConfigError, yaml.YAMLError) as exc:
        raise CheckpointError(f"{path}: its config does not validate: {exc}") from None
    published = state.get("weights")
    updates = int(state["core"].get("num_updates", -1)) if isinstance(state["core"], Mapping) else -1
    if isinstance(published, Mapping) and published:
        weights = {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v, np.float32) for k, v in published.items()}
        return Loaded(cfg, int(state["version"]), updates, weights, exact=True)
    from rlfleet.common.envs import probe_env

    obs_space, act_space = probe_env(cfg)
    core = algorithms.get(cfg.algorithm.name).make_learner(cfg.algorithm, obs_space, act_space, device="cpu",
                                                           seed=cfg.seed)
    try:
        core.load_state(state["core"])
    except (ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: learner state does not load: {exc}") from None
    return Loaded(cfg, int(state["version"]), updates, core.weights(), exact=False)


def load_paramserver_snapshot(run_dir: str | Path) -> Loaded:
    """The weights gradient workers trained, from the paramserver's shard checkpoints of a run.

    The config is the run's (RUN_DIR/config.yaml); every shard of ``paramserver.shards`` must be there.
    The version is the lowest of the shards' (each counts its own applied steps)."""
    import json

    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise CheckpointError(f"{config_path}: no such file (a paramserver snapshot is read with its run's config)")
    try:
        cfg = config_mod.load(str(config_path))
    except (config_mod.ConfigError, ValueError) as exc:
        raise CheckpointError(f"{config_path}: does not validate: {exc}") from None
    weights: dict[str, np.ndarray] = {}
    versions: list[int] = []
    for shard in range(cfg.paramserver.shards):
        path = run_dir / "paramserver" / f"shard-{shard}.npz"
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file (the run's paramserver.shards is {cfg.paramserver.shards};"
                                  " a shard writes its snapshot once it applied gradients)")
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            meta = json.loads(arrays.pop("meta").tobytes())
            versions.append(int(meta["version"]))
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"{path}: not a paramserver snapshot ({type(exc).__name__}: {exc})") from None
        weights.update({k[len("param/"):]: np.asarray(v, np.float32) for k, v in arrays.items()
                        if k.startswith("param/")})
    return Loaded(cfg, min(versions), -1, weights, exact=True)


#: where a run keeps weights: (which, path under RUN_DIR, how the command names it)
BEST_FILE = Path("evaluator") / "best.pt"
LEARNER_FILE = Path("learner") / "checkpoint.pt"
WHICH = ("best", "latest")


def run_weights(run_dir: str | Path, which: str = "best") -> tuple[Path, str]:
    """The file ``rlfleet eval RUN_DIR`` scores and how it is named: ``best`` the best evaluation's
    weights, ``latest`` the learner's checkpoint or the paramserver's snapshot; each falls back on the
    other when the run has only one."""
    if which not in WHICH:
        raise CheckpointError(f"--which {which!r}: allowed: {', '.join(WHICH)}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: not a run directory")
    best = run_dir / BEST_FILE
    latest = run_dir / LEARNER_FILE
    if not latest.is_file():
        latest = run_dir / "paramserver" / "shard-0.npz"
    found = {"best": best if best.is_file() else None, "latest": latest if latest.is_file() else None}
    for name in (which, *(w for w in WHICH if w != which)):
        path = found[name]
        if path is not None:
            what = ("the best evaluation's weights" if name == "best" else
                    "the learner's latest checkpoint" if path.suffix == ".pt" else "the paramserver's snapshot")
            return path, what if name == which else f"{what} (the run has no {which})"
    raise CheckpointError(f"{run_dir}: holds no weights (looked for {BEST_FILE}, {LEARNER_FILE} and "
                          "paramserver/shard-*.npz)")


def load_any(path: str | Path) -> Loaded:
    """A learner checkpoint, the evaluator's best.pt, or a paramserver shard snapshot (.npz) of a run."""
    path = Path(path)
    if path.suffix == ".npz":
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        return load_paramserver_snapshot(path.parent.parent)
    return load_for_eval(path)


def make_policy(cfg: Experiment, weights: Mapping[str, np.ndarray]) -> Any:
    """The acting policy the evaluator builds, with ``weights`` loaded."""
    from rlfleet.common.envs import acting_policy

    policy = acting_policy(cfg)
    policy.load_weights(weights)
    return policy


def evaluate_weights(cfg: Experiment, weights: Mapping[str, np.ndarray], episodes: int | None = None,
                     seed: int | None = None) -> np.ndarray:
    """Returns of the evaluator's evaluation of ``weights`` (its episodes and seeds by default)."""
    from rlfleet.common.evaluation import EVAL_SEED_OFFSET, evaluate

    episodes = episodes or cfg.evaluator.episodes
    seed = cfg.seed + EVAL_SEED_OFFSET if seed is None else seed
    return evaluate(make_policy(cfg, weights), cfg, episodes, seed)


def record_gif(cfg: Experiment, policy: Any, seed: int, path: str | Path, max_frames: int = 2000) -> float:
    """Play one episode (the env reset with ``seed``, as evaluate()'s first slot) and write it as a GIF.

    Returns the episode's return."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renders off-screen
    import gymnasium as gym
    from PIL import Image

    from rlfleet.common import atari
    from rlfleet.common.envs import custom_env_class, import_env_modules

    import_env_modules(cfg.env)
    kw = dict(cfg.env.kwargs)
    cls = custom_env_class(cfg.env.id)
    env: gym.Env  # type: ignore[type-arg]
    if atari.is_atari(cfg.env.id):  # the screen as played, the policy fed the preprocessed frames
        env = atari.make_atari(cfg.env.id, cfg.env.atari, {**kw, "render_mode": "rgb_array"},
                               cfg.env.max_episode_steps, training=False)
    elif cls is not None:
        env = cls(render_mode="rgb_array", **kw)  # type: ignore[call-arg]
        if cfg.env.max_episode_steps:
            env = gym.wrappers.TimeLimit(env, cfg.env.max_episode_steps)
    else:
        if cfg.env.max_episode_steps:
            kw["max_episode_steps"] = cfg.env.max_episode_steps
        env = gym.make(cfg.env.id, render_mode="rgb_array", **kw)
    frames: list[Image.Image] = []
    total = 0.0
    try:
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            frame = env.render()
            if frame is not None and len(frames) < max_frames:
                frames.append(Image.fromarray(np.asarray(frame, np.uint8)))
            action = policy.act(np.asarray(obs)[None], deterministic=True)[0][0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = bool(terminated or truncated)
        fps = int(env.metadata.get("render_fps") or 30)
    finally:
        env.close()
    if not frames:
        raise CheckpointError(f"env {cfg.env.id!r} rendered no rgb_array frames")
    frames = [f.quantize(colors=32, method=Image.Quantize.FASTOCTREE) for f in frames]  # 5x faster than median cut
    duration = max(20, round(1000 / fps / 10) * 10)  # GIF delays are centiseconds; < 20 ms plays slowly
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=duration, loop=0, optimize=False)
    return total


@click.command("eval")
@click.argument("run_dir", required=False, type=click.Path(file_okay=False))
@click.option("--checkpoint", "checkpoint", default=None, type=click.Path(dir_okay=False),
              help="a learner checkpoint, RUN_DIR/evaluator/best.pt or RUN_DIR/paramserver/shard-N.npz")
@click.option("--which", type=click.Choice(WHICH), default="best", show_default=True,
              help="with RUN_DIR: the best evaluation's weights or the latest the run holds")
@click.option("--episodes", type=click.IntRange(min=1), default=None,
              help="greedy episodes (default: the config's evaluator.episodes)")
@click.option("--seed", type=int, default=None, help="first episode's seed (default: seed + EVAL_SEED_OFFSET, "
              "the evaluator's)")
@click.option("--video", type=click.Path(dir_okay=False), default=None, help="write the first episode as a GIF")
def eval_checkpoint(run_dir: str | None, checkpoint: str | None, which: str, episodes: int | None,
                    seed: int | None, video: str | None) -> None:
    """Score a run's weights (RUN_DIR: its best by default) or a checkpoint greedily, as the evaluator does,
    with no service running."""
    from rlfleet.common.envs import EnvError
    from rlfleet.common.evaluation import EVAL_SEED_OFFSET

    if video is not None and not video.lower().endswith(".gif"):
        click.echo("rlfleet eval: --video writes a GIF; give a file name ending in .gif", err=True)
        sys.exit(2)
    if (run_dir is None) == (checkpoint is None):
        click.echo("rlfleet eval: give a RUN_DIR or --checkpoint PATH (one of them)", err=True)
        sys.exit(2)
    try:
        what = "checkpoint"
        if run_dir is not None:
            path, what = run_weights(run_dir, which)
            checkpoint = str(path)
        assert checkpoint is not None
        loaded = load_any(checkpoint)
        cfg = loaded.cfg
        seed = cfg.seed + EVAL_SEED_OFFSET if seed is None else seed
        episodes = episodes or cfg.evaluator.episodes
        returns = evaluate_weights(cfg, loaded.weights, episodes, seed)
    except (CheckpointError, EnvError) as exc:  # EnvError: the run's env cannot be made here
        click.echo(f"rlfleet eval: {exc}", err=True)
        sys.exit(2)
    kind = "published weights" if loaded.exact else f"online net after update {loaded.updates}"
    click.echo(f"{what} {checkpoint}: {cfg.env.id}, {cfg.algorithm.name}, version {loaded.version} ({kind})")
    click.echo(f"eval over {episodes} episodes (seeds {seed}..{seed + episodes - 1}): "
               f"mean {returns.mean():.2f} std {returns.std():.2f}")
    if video is not None:
        ret = record_gif(cfg, make_policy(cfg, loaded.weights), seed, video)
        click.echo(f"video: {video} (episode with seed {seed}, return {ret:g})")
