"""Pixels through the fleet (Pong, configs/pong-dqn.yaml), each figure beside its ceiling in the same run.

    .venv/bin/python -m bench.learning.pixels [--quick] [--curve SECONDS]

- ``frames_ratio``: env frames/s (agent steps x frame skip) of ``rlfleet up`` with 1, 2 and 4 actors
  (learner, replay, paramserver and evaluator running too) over their steady part, against a bare loop
  of one actor's vector env (same preprocessing, random actions) in one process on this machine's
  cores. Beside it, ``actor_loop``: the same vector env acted on by the CNN policy with the adder
  and the Ape-X initial priorities, in one process without sockets, the most an actor could do.
- ``bytes_ratio``: replay bytes per transition, frames shared (``frames: auto``), against the same
  table keeping whole stacks (``frames: off``), both filled with the same real Pong transitions
  (random play through the n-step adder) past one lap of the ring.
- ``ingest_ratio``: insert MB/s of real Pong transitions (64 per insert, packed as InsertClient
  sends them: each distinct frame once; acked, ``actor.max_unacked`` window) into a replay process
  with shared frames, against raw PUSH/PULL of the very same encoded bytes between two processes.
  Median of 3 alternating repeats. (The actor's packing cost is in ``actor_loop``.)
- ``compression``: the ratio and speeds of lz4 and zstd (level 1) on the frames inserts carry, to
  judge whether compressing them on the wire or at rest would pay.
- ``learner_ratio``: DQN updates/s of the Nature CNN (batch 32) sampling a replay process over a
  socket (priorities written back), against the same learner in a loop over batches already in
  memory, with the config's torch threads (and ``learner_ratio_1_thread``: one thread, leaving a
  core to replay). Median of 3 alternating repeats.

``--peer sample-factory``: instead of the figures above, the race of env frames/s on Pong against
Sample Factory 2.1.1's APPO (its tuned Atari example, bench/peers/sample_factory_atari_runner.py, in
its venv under .peers/, `make peers`): for each ``--actors`` count N, rlfleet's DQN fleet
(configs/pong-dqn.yaml), rlfleet's PPO fleet (configs/breakout-ppo.yaml on ALE/Pong-v5) as shipped
(barrier: DPPO) and asynchronous (``sync=async``: APPO) with N actors, and Sample Factory with N
rollout workers, twice: its tuned Atari example as published (one env a
worker, synchronous) and the throughput settings of its docs (8 envs a worker in two alternating
halves, asynchronous). Each side runs ``--seconds`` (90; 40 with --quick), measured over its steady
part, the five in rotating order for each N. ``ratio_ppo`` / ``ratio_appo`` / ``ratio_dqn``: rlfleet's frames/s over
the faster Sample Factory run at the same N (the issue's goal: PPO >= 1.0). Beside them the bare env
ceiling.

``--curve SECONDS``: also train Pong for that long with the shipped config and 2 actors, and write
the curve (eval return against env frames and wall time) next to the JSON (bench/results/).
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.learning import scaling
from bench.learning.peer_results import save_race
from bench.learning.pixels_data import CONFIG, RESULTS, chunks, pong_config, transitions
from bench.learning.pixels_replay import ingest, updates_per_s
from bench.peers.venv_peers import PeerError, check_peer, run_pixels_peer
from rlfleet.common import config as config_mod
from rlfleet.common.config import TableConfig
from rlfleet.common.envs import acting_policy, make_vector_env


# -- frames -------------------------------------------------------------------
def env_ceiling(seconds: float) -> float:
    """Env frames/s of one actor's vector env, random actions, no policy."""
    return scaling.env_ceiling(CONFIG, [], seconds) * pong_config().env.atari.frame_skip


def actor_loop(seconds: float) -> dict[str, float]:
    """Env frames/s of one actor's work without sockets: CNN acting, the adder, initial priorities,
    packing the frames of each insert."""
    from rlfleet.common import algorithms
    from rlfleet.common.wire.frames import pack_frames

    cfg = pong_config()
    torch.set_num_threads(cfg.actor.torch_threads)
    algo = algorithms.get(cfg.algorithm.name)
    envs = make_vector_env(cfg.env, 0, algo.autoreset_mode)
    policy = acting_policy(cfg, 0)
    policy.explore(0, 1, 0)
    adder = algo.make_adder(cfg.algorithm, cfg.env.num_envs, envs.single_observation_space,
                            envs.single_action_space, algo.autoreset_mode)
    spent = {"env": 0.0, "act": 0.0, "priorities": 0.0, "pack_frames": 0.0}
    pending: list[dict[str, np.ndarray]] = []
    try:
        obs, _ = envs.reset(seed=0)
        adder.reset(obs)
        steps, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            t0 = time.perf_counter()
            actions, extras = policy.act(obs)
            t1 = time.perf_counter()
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            t2 = time.perf_counter()
            pending.append(adder.add(actions, extras, obs, rewards, terminated, truncated, infos, 0))
            t3 = t4 = time.perf_counter()
            if sum(len(p["obs"]) for p in pending) >= cfg.actor.insert_batch:
                batch = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
                policy.priorities(batch)
                t3 = time.perf_counter()
                pack_frames(batch)  # what InsertClient does before sending
                t4 = time.perf_counter()
                pending = []
            spent["act"] += t1 - t0
            spent["env"] += t2 - t1
            spent["priorities"] += t3 - t2
            spent["pack_frames"] += t4 - t3
            steps += cfg.env.num_envs
        elapsed = time.monotonic() - start
        out = {"frames_per_s": steps * cfg.env.atari.frame_skip / elapsed}
        out.update({f"ms_per_step_{k}": 1000 * v / steps for k, v in spent.items()})
        return out
    finally:
        envs.close()


PPO_CONFIG = "configs/breakout-ppo.yaml"
PPO_ON_PONG = ("env.id=ALE/Pong-v5",)  # the shipped Atari PPO (the zoo's settings) on Pong
SF_ENVS_PER_WORKER = 8  # Sample Factory's throughput settings beside its tuned Atari example


def fleet_frames(actors: int, seconds: float, runs: Path, config: str = CONFIG,
                 sets: tuple[str, ...] = ()) -> dict[str, Any]:
    """Steady env frames/s of ``rlfleet up`` with ``actors`` actors (the first quarter left out)."""
    root = runs / f"{Path(config).stem}-actors-{actors}"
    cmd = [sys.executable, "-m", "rlfleet.cli", "up", "--config", config, "--actors", str(actors), "--max-seconds",
           str(seconds), "--runs", str(root)]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=seconds + 180)
    dirs = sorted(root.glob("*/progress.csv"))
    if not dirs:
        raise SystemExit(f"no progress.csv under {root}; exit {proc.returncode}:\n{proc.stdout[-2000:]}")
    rows = list(csv.DictReader(dirs[-1].open()))
    rows = [r for r in rows if float(r["wall_s"]) >= seconds / 4]
    first, last = rows[0], rows[-1]
    steps = float(last["env_steps"]) - float(first["env_steps"])
    wall = float(last["wall_s"]) - float(first["wall_s"])
    skip = config_mod.load(config, list(sets), environ={}).env.atari.frame_skip
    return {"frames_per_s": steps * skip / wall, "updates_per_s": (float(last["updates"]) - float(first["updates"]))
            / wall}


# -- bytes --------------------------------------------------------------------
def bytes_per_transition(data: dict[str, np.ndarray], capacity: int) -> dict[str, float]:
    from rlfleet.services.replay.tables import make_table

    out = {}
    for mode in ("auto", "off"):
        table = make_table(TableConfig(kind="prioritized", capacity=capacity, min_size=1, frames=mode))
        for part in chunks(data, 64):
            table.insert(part)
        out[mode] = table.bytes_per_item()
    return out


# -- compression --------------------------------------------------------------
def compression(batches: list[dict[str, np.ndarray]]) -> dict[str, dict[str, float]]:
    """What lz4 and zstd (level 1) would make of the frames inserts carry (packed: each frame once)."""
    import lz4.frame
    import zstandard

    from rlfleet.common.wire.frames import FRAMES, pack_frames

    frames = [pack_frames(b)[FRAMES].tobytes() for b in batches]
    raw = sum(len(f) for f in frames)
    zc, zd = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()
    out = {}
    for name, comp, dec in (("lz4", lz4.frame.compress, lz4.frame.decompress), ("zstd_1", zc.compress, zd.decompress)):
        t0 = time.perf_counter()
        packed = [comp(f) for f in frames]
        t1 = time.perf_counter()
        for c in packed:
            dec(c)
        t2 = time.perf_counter()
        out[name] = {"ratio": round(raw / sum(len(c) for c in packed), 1),
                     "compress_mb_per_s": round(raw / (t1 - t0) / 1e6),
                     "decompress_mb_per_s": round(raw / (t2 - t1) / 1e6)}
    return out


# -- curve --------------------------------------------------------------------
def curve(seconds: float, runs: Path) -> dict[str, Any]:
    root = runs / "curve"
    cmd = [sys.executable, "-m", "rlfleet.cli",
           "up", "--config", CONFIG, "--actors", "2", "--max-seconds", str(seconds),
           "--runs", str(root)]
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=seconds + 300)
    rows = list(csv.DictReader(sorted(root.glob("*/progress.csv"))[-1].open()))
    skip = pong_config().env.atari.frame_skip
    points = [{"wall_s": float(r["wall_s"]), "env_frames": int(float(r["env_steps"])) * skip,
               "updates": int(float(r["updates"])), "eval_return": float(r["eval_return"])}
              for r in rows if r["eval_return"] not in ("", None)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pixels_curve.json").write_text(json.dumps(points, indent=1))
    plot_curve(points, seconds, Path("docs/pixels_curve.png"))
    last = rows[-1]
    return {"seconds": seconds, "env_frames": int(float(last["env_steps"])) * skip,
            "updates": int(float(last["updates"])),
            "evals": [(p["env_frames"], p["eval_return"]) for p in points],
            "best_eval": max((p["eval_return"] for p in points), default=None)}


def plot_curve(points: list[dict[str, Any]], seconds: float, path: Path) -> None:
    """Greedy evaluation return against env frames and against wall time, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_frames, by_time) = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    returns = [p["eval_return"] for p in points]
    by_frames.plot([p["env_frames"] / 1e6 for p in points], returns)
    by_frames.set_xlabel("env frames (millions)")
    by_frames.set_ylabel("greedy eval return (2 games)")
    by_time.plot([p["wall_s"] / 60 for p in points], returns)
    by_time.set_xlabel("wall time (minutes)")
    fig.suptitle(f"Pong, configs/pong-dqn.yaml, 2 actors, {seconds / 60:.0f} minutes on 2 CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def peer_race(actors: list[int], seconds: float, runs: Path) -> dict[str, Any]:
    """Env frames/s on Pong: rlfleet's DQN and PPO fleets against Sample Factory APPO, N actors / N workers."""
    sides: dict[str, Any] = {
        "rlfleet_dqn": lambda n: fleet_frames(n, seconds, runs)["frames_per_s"],
        "rlfleet_ppo": lambda n: fleet_frames(n, seconds, runs, PPO_CONFIG, PPO_ON_PONG)["frames_per_s"],
        "rlfleet_appo": lambda n: fleet_frames(n, seconds, runs, PPO_CONFIG, (*PPO_ON_PONG, "sync=async"))[
            "frames_per_s"],
        "sample_factory_appo": lambda n: run_pixels_peer(n, seconds)["frames_per_s"],
        f"sample_factory_appo_{SF_ENVS_PER_WORKER}_envs": lambda n: run_pixels_peer(
            n, seconds, SF_ENVS_PER_WORKER)["frames_per_s"],
    }
    names = list(sides)
    frames: dict[str, dict[str, float]] = {name: {} for name in names}
    for i, n in enumerate(actors):
        k = i % len(names)
        for name in names[k:] + names[:k]:  # rotating order: a slow stretch falls on every side
            frames[name][str(n)] = round(sides[name](n), 1)
            print(f"# {n} actor(s)/worker(s), {name}: {frames[name][str(n)]} frames/s", flush=True)
    best_peer = {str(n): max(frames[name][str(n)] for name in names if name.startswith("sample_factory"))
                 for n in actors}
    ceiling = env_ceiling(10.0)
    return {"peer": "sample-factory", "seconds": seconds, "raw_env_frames_per_s": round(ceiling),
            "frames_per_s": frames, "sample_factory_best": best_peer,
            "ratio_ppo": {n: round(frames["rlfleet_ppo"][n] / v, 3) for n, v in best_peer.items()},
            "ratio_appo": {n: round(frames["rlfleet_appo"][n] / v, 3) for n, v in best_peer.items()},
            "ratio_dqn": {n: round(frames["rlfleet_dqn"][n] / v, 3) for n, v in best_peer.items()}}


def median(values: list[float]) -> float:
    return float(np.median(values))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter fleet runs and fewer messages")
    p.add_argument("--curve", type=float, default=0.0, help="also train Pong this many seconds (2 actors)")
    p.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--curve-only", action="store_true", help="only the training curve (with --curve)")
    p.add_argument("--peer", choices=["sample-factory"], default=None,
                   help="only the race of env frames/s against this peer (its venv: make peers)")
    p.add_argument("--seconds", type=float, default=None, help="--peer: seconds a side (default 90, --quick 40)")
    p.add_argument("--docs", action="store_true",
                   help="--peer: keep the JSON line as docs/results/peers-pixels-pong.json (the results page)")
    args = p.parse_args()
    fleet_s = 40.0 if args.quick else 90.0
    if args.peer is not None:
        try:
            check_peer(args.peer, "ppo")
            with tempfile.TemporaryDirectory(prefix="rlfleet-pixels-") as tmp:
                race = peer_race(args.actors, args.seconds or fleet_s, Path(tmp))
        except PeerError as exc:
            raise SystemExit(f"bench.learning.pixels --peer {args.peer}: {exc}") from None
        line = {"config": CONFIG, "ppo_config": PPO_CONFIG, **race}
        print(json.dumps(line))
        if args.docs:
            save_race("pixels-pong", "bench.learning.pixels", line)
        return
    repeats = 1 if args.quick else 3
    result: dict[str, Any] = {"config": CONFIG}
    with tempfile.TemporaryDirectory(prefix="rlfleet-pixels-") as tmp:
        runs = Path(tmp)
        if args.curve_only:
            result["curve"] = curve(args.curve, runs)
            print(json.dumps(result))
            return
        print("# Pong transitions from random play", flush=True)
        data = transitions(2560 if args.quick else 6400)
        naive = bytes_per_transition(data, capacity=len(data["obs"]) // 2)
        result["bytes_per_transition"] = {"shared_frames": round(naive["auto"], 1),
                                          "whole_stacks": round(naive["off"], 1)}
        result["bytes_ratio"] = round(naive["auto"] / naive["off"], 4)
        print(f"# bytes per transition: {naive}", flush=True)

        batches = chunks(data, 64)
        result["compression"] = compression(batches)
        print(f"# compression of packed frames: {result['compression']}", flush=True)
        msgs = 300 if args.quick else 800
        ours, raw = [], []
        for _ in range(repeats):
            ours.append(ingest("ours", batches, msgs, capacity=len(data["obs"]) // 2))
            raw.append(ingest("raw", batches, msgs, capacity=0))
            print(f"# ingest MB/s: ours {ours[-1]:.0f}, raw {raw[-1]:.0f}", flush=True)
        result["ingest_mb_per_s"] = {"ours": round(median(ours), 1), "raw_push_pull": round(median(raw), 1)}
        result["ingest_ratio"] = round(median([o / r for o, r in zip(ours, raw, strict=True)]), 3)

        up_s = 15.0 if args.quick else 30.0
        config_threads = pong_config().learner.torch_threads
        for threads in sorted({config_threads, 1}, reverse=True):
            via, inproc = [], []
            for _ in range(repeats):
                via.append(updates_per_s("replay", data, up_s, threads))
                inproc.append(updates_per_s("inproc", data, up_s, threads))
                print(f"# updates/s, {threads} torch thread(s): through replay {via[-1]:.1f}, in process "
                      f"{inproc[-1]:.1f}", flush=True)
            key = "" if threads == config_threads else f"_{threads}_thread"
            result[f"learner_updates_per_s{key}"] = {"through_replay": round(median(via), 2),
                                                     "in_process": round(median(inproc), 2)}
            result[f"learner_ratio{key}"] = round(median([v / i for v, i in zip(via, inproc, strict=True)]), 3)

        ceiling = env_ceiling(10.0)
        loop = actor_loop(15.0)
        print(f"# raw env frames/s {ceiling:.0f}; actor loop {loop}", flush=True)
        result["raw_env_frames_per_s"] = round(ceiling)
        result["actor_loop"] = {k: round(v, 3) for k, v in loop.items()}
        fleets = {}
        for n in args.actors:
            fleets[n] = fleet_frames(n, fleet_s, runs)
            print(f"# {n} actor(s): {fleets[n]}", flush=True)
        result["fleet_frames_per_s"] = {str(n): round(f["frames_per_s"]) for n, f in fleets.items()}
        result["fleet_updates_per_s"] = {str(n): round(f["updates_per_s"], 2) for n, f in fleets.items()}
        result["frames_ratio"] = {str(n): round(f["frames_per_s"] / ceiling, 3) for n, f in fleets.items()}
        result["actor_loop_ratio"] = round(loop["frames_per_s"] / ceiling, 3)
        if args.curve:
            result["curve"] = curve(args.curve, runs)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
