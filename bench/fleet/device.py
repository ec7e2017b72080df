"""The GPU learner in one command: CPU against CUDA, on a machine with one GPU, in at most 8 minutes.

    .venv/bin/python -m bench.fleet.device [--cpu] [--only PARTS] [--fleet-seconds S]

Parts (``--only``, comma-separated; default all):

- ``updates``: learner updates/s of each network on CPU (``--cpu-threads``, default 2) and on CUDA:
  the DQN MLP (configs/cartpole-dqn.yaml), the Nature CNN under DQN (configs/pong-dqn.yaml) and
  under PPO (configs/breakout-ppo.yaml), and SAC (configs/pendulum-sac.yaml). Each learner is made
  by its algorithm's Builder and learns from real items: the config's env played by its acting
  policy through its adder, as an actor makes them. ``cuda_over_cpu``: CUDA's over CPU's.
- ``weights``: a CPU and a CUDA learner of the same seed, three updates on the same batches in
  float32 (``update_dtype`` float32 where the algorithm has it); ``max_abs_diff`` over every
  published weight.
- ``checkpoint``: a CUDA learner's checkpoint (through a file, loaded as the learner service loads
  it) resumed by a CPU learner and the other way round, each then taking one update;
  ``max_abs_diff`` between the weights before the move and after the load.
- ``fleet``: ``rlfleet up`` DQN and PPO (Pong and Breakout; CartPole with ``--cpu``) with
  ``learner.device=cuda`` (cpu with ``--cpu``): updates/s and env steps/s over the run's steady part
  (the first quarter left out) and the device the learner's log says it trains on, with its reason.
- ``scaling``: actors 1, 2, 4, 8, 14 (1, 2 with ``--cpu``) on configs/cartpole-dqn-slowsim.yaml with
  a 2 ms env step, each a fixed-length ``rlfleet up``: env steps/s against N x one actor's ceiling
  (bench.learning.scaling's bare vector env loop), ``speedup_N_steps``.
- ``a3c``: configs/cartpole-a3c.yaml with 1 and 4 gradient workers for the same time: ``speedup_4``
  = env steps/s of 4 workers over 1.
- ``pixels``: ``rlfleet up`` Pong (configs/pong-dqn.yaml, 2 actors) with the learner's CNN on the
  GPU: ``frames_ratio`` = env frames/s against one actor's bare vector env (bench.learning.pixels'
  ceiling). The actors' acting policy runs on CPU (every actor builds it there).

``--cpu`` runs every part on CPU, shortened; what needs CUDA says ``"skipped: no CUDA"`` instead of a
figure (also without ``--cpu`` on a machine where torch sees no GPU). Last line: one JSON object.
docs/operations.md says what to carry to a GPU machine without a package index.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.learning import pixels, scaling
from rlfleet.common import config as config_mod
from rlfleet.common.envs import acting_policy, make_vector_env, probe_env

PARTS = ("updates", "weights", "checkpoint", "fleet", "scaling", "a3c", "pixels")
SKIPPED = "skipped: no CUDA"
# name -> (config, its overrides in full, its overrides with --cpu: every part small)
NETWORKS: dict[str, tuple[str, list[str], list[str]]] = {
    "dqn_mlp": ("configs/cartpole-dqn.yaml", [], []),
    "dqn_nature_cnn": ("configs/pong-dqn.yaml", [], ["algorithm.batch_size=8"]),
    "ppo_nature_cnn": ("configs/breakout-ppo.yaml", [],
                       ["algorithm.segment_length=8", "algorithm.batch_segments=2", "algorithm.minibatch_size=8",
                        "algorithm.epochs=1", "env.num_envs=2"]),
    "sac_mlp": ("configs/pendulum-sac.yaml", [], []),
}
_TRAINS_ON = re.compile(r"learner: trains on (\S+) \(([^)]*)\)")


def cuda_ready() -> bool:
    return torch.cuda.is_available()


# -- learners in one process ----------------------------------------------------
def network_config(name: str, short: bool, float32: bool = False) -> Any:
    path, sets, short_sets = NETWORKS[name]
    sets = sets + (short_sets if short else [])
    cfg = config_mod.load(path, sets, environ={})
    if float32 and hasattr(cfg.algorithm, "update_dtype"):
        cfg = config_mod.load(path, [*sets, "algorithm.update_dtype=float32"], environ={})
    return cfg


def items(cfg: Any, count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``count`` items as an actor makes them: the config's env played by its acting policy through its adder."""
    from rlfleet.common import algorithms

    algo = algorithms.get(cfg.algorithm.name)
    envs = make_vector_env(cfg.env, seed, algo.autoreset_mode)
    policy = acting_policy(cfg, seed)
    policy.explore(0, 1, 0)
    adder = algo.make_adder(cfg.algorithm, cfg.env.num_envs, envs.single_observation_space,
                            envs.single_action_space, algo.autoreset_mode)
    parts: list[dict[str, np.ndarray]] = []
    n = 0
    try:
        obs, _ = envs.reset(seed=seed)
        adder.reset(obs)
        while n < count:
            actions, extras = policy.act(obs)
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            got = adder.add(actions, extras, obs, rewards, terminated, truncated, infos, 0)
            first = next(iter(got.values()), np.empty(0))
            if len(first):
                parts.append(got)
                n += len(first)
    finally:
        envs.close()
    return {k: np.concatenate([p[k] for p in parts])[:count] for k in parts[0]}


def make_learner(cfg: Any, device: str) -> Any:
    from rlfleet.common import algorithms

    obs_space, act_space = probe_env(cfg)
    return algorithms.get(cfg.algorithm.name).make_learner(cfg.algorithm, obs_space, act_space, device=device,
                                                           seed=cfg.seed)


def batches(learner: Any, data: dict[str, np.ndarray], count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``count`` batches of the learner's ``batch_items``, drawn from ``data`` with a fixed seed."""
    rng = np.random.default_rng(seed)
    size = learner.data.batch_items
    total = len(next(iter(data.values())))
    return [{k: v[idx] for k, v in data.items()} for idx in (rng.integers(0, total, size) for _ in range(count))]


def learn(learner: Any, batch: dict[str, np.ndarray]) -> None:
    probability = batch.get("probability")
    weights = learner.weigh(probability) if probability is not None else None
    learner.learn({k: v for k, v in batch.items() if k != "probability"}, weights)


def updates_per_s(cfg: Any, device: str, pool: list[dict[str, np.ndarray]], seconds: float) -> float:
    learner = make_learner(cfg, device)
    learn(learner, pool[0])  # warm-up: allocations, cuDNN's choice of kernels
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    n, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        learn(learner, pool[n % len(pool)])
        n += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return n / (time.monotonic() - start)


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)))) for k in a)


def part_updates(args: argparse.Namespace, data: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    out: dict[str, Any] = {"cpu_threads": args.cpu_threads}
    for name in args.networks:
        cfg = network_config(name, args.cpu)
        pool = batches(make_learner(cfg, "cpu"), data[name], 4)
        torch.set_num_threads(args.cpu_threads)
        cpu = updates_per_s(cfg, "cpu", pool, args.update_seconds)
        row: dict[str, Any] = {"cpu": round(cpu, 2), "cuda": SKIPPED, "cuda_over_cpu": SKIPPED}
        if not args.cpu and cuda_ready():
            gpu = updates_per_s(cfg, "cuda", pool, args.update_seconds)
            row |= {"cuda": round(gpu, 2), "cuda_over_cpu": round(gpu / cpu, 2)}
        out[name] = row
        print(f"# updates/s {name}: {row}", flush=True)
    return out


def same_updates(cfg: Any, data: dict[str, np.ndarray], one: str, other: str) -> dict[str, float]:
    """Learners of the same seed on devices ``one`` and ``other``, three updates on the same batches: the
    largest difference of their published weights before and after."""
    a, b = make_learner(cfg, one), make_learner(cfg, other)
    before = max_abs_diff(a.weights(), b.weights())
    for batch in batches(a, data, 3, seed=1):
        learn(a, batch)
        learn(b, batch)
    return {"max_abs_diff": max_abs_diff(a.weights(), b.weights()), "max_abs_diff_before": before}


def part_weights(args: argparse.Namespace, data: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    if args.cpu or not cuda_ready():
        return {name: SKIPPED for name in args.networks}
    out: dict[str, Any] = {}
    for name in args.networks:
        out[name] = same_updates(network_config(name, args.cpu, float32=True), data[name], "cpu", "cuda")
        print(f"# weights after 3 updates {name}: {out[name]}", flush=True)
    return out


def moved(state: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``state`` through a checkpoint file, read back as the learner service reads it (on CPU, weights only)."""
    from rlfleet.common.algorithms.checkpoint import load_checkpoint, save_checkpoint

    path = folder / "learner.pt"
    save_checkpoint(path, state)
    loaded = load_checkpoint(path)
    assert loaded is not None
    return loaded


def resumed_on(cfg: Any, data: dict[str, np.ndarray], src: str, dst: str, folder: Path) -> dict[str, Any]:
    """A learner on ``src`` after one update, its checkpoint through a file into a learner of another seed on
    ``dst``, which then takes an update: whether it resumed, and how far its weights were from the source's."""
    source = make_learner(cfg, src)
    pool = batches(source, data, 2, seed=2)
    learn(source, pool[0])
    target = make_learner(cfg.model_copy(update={"seed": cfg.seed + 1}), dst)
    try:
        target.load_state(moved(source.state(), folder))
        diff = max_abs_diff(source.weights(), target.weights())
        learn(target, pool[1])
    except Exception as exc:  # the figure is whether it resumes: say why it did not
        return {"resumed": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"resumed": True, "max_abs_diff": diff, "updates": target.num_updates}


def part_checkpoint(args: argparse.Namespace, data: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    if args.cpu or not cuda_ready():
        return {name: SKIPPED for name in args.networks}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rlfleet-device-") as tmp:
        for name in args.networks:
            cfg = network_config(name, args.cpu, float32=True)
            out[name] = {f"{src}_to_{dst}": resumed_on(cfg, data[name], src, dst, Path(tmp))
                         for src, dst in (("cuda", "cpu"), ("cpu", "cuda"))}
            print(f"# checkpoint across devices {name}: {out[name]}", flush=True)
    return out


# -- fleets -----------------------------------------------------------------------
def fleet_run(config: str, sets: list[str], actors: int, seconds: float, runs: Path) -> dict[str, Any]:
    """One ``rlfleet up`` for ``seconds``: its steady env steps/s and updates/s (the first quarter of its rows
    left out) and the device its learner's log names."""
    root = runs / f"{Path(config).stem}-{actors}-{len(list(runs.glob('*')))}"
    cmd = [sys.executable, "-m", "rlfleet.cli", "up", "--config", config, "--actors", str(actors),
           "--max-seconds", str(seconds), "--runs", str(root)]
    for s in sets:
        cmd += ["--set", s]
    print(f"# {' '.join(cmd[2:])}", flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=seconds + 300,
                          stdin=subprocess.DEVNULL)
    dirs = sorted(root.glob("*/progress.csv"))
    if not dirs:
        raise SystemExit(f"no progress.csv under {root}; exit {proc.returncode}:\n{proc.stdout[-2000:]}")
    rows = list(csv.DictReader(dirs[-1].open()))
    steady = [r for r in rows if float(r["wall_s"]) >= seconds / 4] or rows
    first, last = steady[0], steady[-1]
    wall = float(last["wall_s"]) - float(first["wall_s"])
    out: dict[str, Any] = {"seconds": seconds, "actors": actors}
    if wall > 0:
        out["env_steps_per_s"] = round((float(last["env_steps"]) - float(first["env_steps"])) / wall, 1)
        out["updates_per_s"] = round((float(last["updates"]) - float(first["updates"])) / wall, 2)
    else:
        out["env_steps_per_s"] = out["updates_per_s"] = 0.0
    learner_logs = sorted((dirs[-1].parent / "logs").glob("learner*.log"))
    said = _TRAINS_ON.findall("".join(p.read_text(errors="replace") for p in learner_logs))
    if said:
        out["learner_device"], out["learner_device_reason"] = said[-1]
    return out


def part_fleet(args: argparse.Namespace, runs: Path) -> dict[str, Any]:
    device = "cpu" if args.cpu else "cuda"
    out: dict[str, Any] = {"learner_device_asked": device}
    if device == "cuda" and not cuda_ready():
        return {"dqn": SKIPPED, "ppo": SKIPPED}
    configs = {"dqn": "configs/cartpole-dqn.yaml", "ppo": "configs/cartpole-ppo.yaml"} if args.cpu else \
        {"dqn": "configs/pong-dqn.yaml", "ppo": "configs/breakout-ppo.yaml"}
    for algo, config in configs.items():
        out[algo] = {"config": config, **fleet_run(config, [f"learner.device={device}"], 2, args.fleet_seconds, runs)}
        print(f"# fleet {algo}: {out[algo]}", flush=True)
    return out


def part_scaling(args: argparse.Namespace, runs: Path) -> dict[str, Any]:
    sets = ["env.step_latency_ms=2"] + ([] if args.cpu or not cuda_ready() else ["learner.device=cuda"])
    ceiling = scaling.env_ceiling(scaling.CONFIG, sets, seconds=2.0 if args.cpu else 3.0)
    counts = [1, 2] if args.cpu else [1, 2, 4, 8, 14]
    out: dict[str, Any] = {"config": scaling.CONFIG, "latency_ms": 2.0, "env_ceiling_steps_per_s": round(ceiling, 1),
                           "actors": {}}
    for n in counts:
        row = fleet_run(scaling.CONFIG, sets, n, args.fleet_seconds, runs)
        row["of_ideal_steps_per_s"] = round(row["env_steps_per_s"] / (n * ceiling), 2)
        out["actors"][str(n)] = row
        print(f"# scaling {n} actor(s): {row}", flush=True)
    base = out["actors"][str(counts[0])]["env_steps_per_s"]
    for n in counts[1:]:
        out[f"speedup_{n}_steps"] = round(out["actors"][str(n)]["env_steps_per_s"] / base, 2) if base else None
    return out


def part_a3c(args: argparse.Namespace, runs: Path) -> dict[str, Any]:
    config = "configs/cartpole-a3c.yaml"
    out: dict[str, Any] = {"config": config, "workers": {}}
    for n in (1, 4):
        out["workers"][str(n)] = fleet_run(config, [], n, args.fleet_seconds, runs)
        print(f"# a3c {n} worker(s): {out['workers'][str(n)]}", flush=True)
    one = out["workers"]["1"]["env_steps_per_s"]
    out["speedup_4"] = round(out["workers"]["4"]["env_steps_per_s"] / one, 2) if one else None
    return out


def part_pixels(args: argparse.Namespace, runs: Path) -> dict[str, Any]:
    if not args.cpu and not cuda_ready():
        return {"frames_ratio": SKIPPED}
    device = "cpu" if args.cpu else "cuda"
    ceiling = pixels.env_ceiling(2.0 if args.cpu else 5.0)
    row = fleet_run(pixels.CONFIG, [f"learner.device={device}"], 2, args.fleet_seconds, runs)
    frames = row["env_steps_per_s"] * pixels.pong_config().env.atari.frame_skip
    out = {"config": pixels.CONFIG, "learner_device_asked": device, "raw_env_frames_per_s": round(ceiling),
           "fleet_frames_per_s": round(frames), "frames_ratio": round(frames / ceiling, 3), **row}
    print(f"# pixels: {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="every part on CPU, shortened; CUDA parts say skipped")
    ap.add_argument("--only", default=",".join(PARTS), help=f"parts to run, comma-separated, of {','.join(PARTS)}")
    ap.add_argument("--networks", default=",".join(NETWORKS),
                    help=f"networks of the updates, weights and checkpoint parts, of {','.join(NETWORKS)}")
    ap.add_argument("--cpu-threads", type=int, default=2, help="torch threads of the CPU learner")
    ap.add_argument("--update-seconds", type=float, default=None, help="seconds of each updates/s figure")
    ap.add_argument("--fleet-seconds", type=float, default=None, help="seconds of each rlfleet up")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"--only {args.only}: unknown part(s) {', '.join(unknown)}; allowed: {', '.join(PARTS)}")
    args.networks = [n.strip() for n in args.networks.split(",") if n.strip()]
    if not args.networks or set(args.networks) - set(NETWORKS):
        ap.error(f"--networks {','.join(args.networks)}: allowed: {', '.join(NETWORKS)}")
    if args.cpu_threads < 1:
        ap.error(f"--cpu-threads {args.cpu_threads}: at least 1")
    args.update_seconds = args.update_seconds or (1.0 if args.cpu else 5.0)
    args.fleet_seconds = args.fleet_seconds or (15.0 if args.cpu else 20.0)
    started = time.monotonic()
    result: dict[str, Any] = {
        "bench": "device", "mode": "cpu" if args.cpu else "cuda", "cuda_available": cuda_ready(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda_ready() else None, "cores": len(os.sched_getaffinity(0)),
        "date": time.strftime("%Y-%m-%d"),
    }
    data: dict[str, dict[str, np.ndarray]] = {}
    cuda_parts = not args.cpu and cuda_ready()
    if "updates" in parts or (cuda_parts and {"weights", "checkpoint"} & set(parts)):
        for name in args.networks:
            cfg = network_config(name, args.cpu)
            need = make_learner(cfg, "cpu").data.batch_items * 4
            data[name] = items(cfg, need)
    with tempfile.TemporaryDirectory(prefix="rlfleet-device-runs-") as tmp:
        runs = Path(tmp)
        for part in parts:
            if part in ("updates", "weights", "checkpoint"):
                result[part] = globals()[f"part_{part}"](args, data)
            else:
                result[part] = globals()[f"part_{part}"](args, runs)
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, default=float))
    return result


if __name__ == "__main__":
    main()
