"""Hostile clients against live services: valid inserts from 4 well-behaved writers, and a gradient-worker
fleet training, while a hostile peer floods replay and the paramservers; does any accepted insert get
lost, stored twice, a forged version stored, the model's weights turn non-finite or stop improving, or
the services' memory run away?

    .venv/bin/python -m bench.fleet.hostile [--seconds 8] [--writers 4] [--workers 2]

Replay (durability ``wal``, a uniform table), a paramserver holding a published version 0 (so replay
knows which versions exist) and a gradient-worker fleet (``configs/cartpole-a3c.yaml``: its own
paramserver and ``--workers`` A3C workers) run as real processes (`rlfleet service`). Each of
``--writers`` processes inserts batches of 64 CartPole-shaped transitions that name themselves (writer,
idx) through ``InsertClient`` for ``--seconds``, once undisturbed (the reference) and once while a
hostile process sends, in a loop: undecodable frames, headers that break every rule, inserts whose
sender ids imitate the writers' readable names (at seq 2^64-1, or with frames that do not match their
header), inserts from ever new sender ids, oversized single frames (600 MiB: refused as their size
arrives), garbage and partition-breaking publishes to the paramserver, and the second pass of issue 42:

- forged versions: inserts whose ``version`` column claims 10^12, 2^63-1, -1 or -2^63;
- poisoned gradients to the gradient-worker fleet's paramserver: a NaN, an Inf, elements of 1e20, an
  L2 norm of twice ``paramserver.max_gradient_norm``, a version it never held, and barrier pushes in the
  names of its live workers (read from its ``info``) carrying gradients of 1e20;
- registry overflow: ``hello`` from ever new actor ids, ``heartbeat`` claiming 2^63-1 env steps and
  the newest version 2^63-1 (and 2^64-1, out of the wire's range), then a fresh ``hello`` must still
  get ``welcome``;
- seq-window spoofing: inserts under guessed writer ids at a first seq of 2^63 and at seqs 8,193 and
  10^6 above the wall clock, and a ``window_start`` of 2^64-1.

Each phase starts a fresh gradient-worker fleet (so both phases carry the same load), lets it train for
the same time (2 x ``--seconds`` + 25 s from its start) and reads its workers' training curve and the
weights its paramserver holds then (evaluated over 10 greedy CartPole episodes, fixed seeds), against
the untrained model. Afterwards replay's write-ahead log is read back.

- ``acked_lost``: inserts a writer was acked for that the log does not hold with the same items (goal 0);
- ``duplicates_stored``: (writer, idx) transitions the log holds more than once (goal 0);
- ``forged_versions_stored``: items in the log whose version is not 0, the only one published (goal 0);
- ``valid_throughput_ratio``: the writers' acked inserts/s under attack / undisturbed (goal >= 0.8);
- ``gradient_fleet``: per phase the version reached, whether every weight is finite, the workers'
  training curve (mean return of their first and last 50 episodes) and a greedy evaluation of the final
  weights; ``improved_under_attack``: finite, and the last 50 episodes under attack return more than the
  first 50 and than the untrained model's greedy return;
- ``registry_ok``: a fresh actor's ``hello`` and ``heartbeat`` answered ``welcome`` after the attack;
- ``rss_growth_mb``: each service's resident memory after the attack minus before it, from /proc
  (goal < 50 each);
- ``replies``: what the hostile peer got back, per service and reply (type, or error reason);
- ``hostile_cpu_s``: CPU seconds the hostile process itself used (it shares the machine's cores with
  the writers: on 2 cores part of the throughput lost under attack is its own CPU).

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from rlfleet.common.wire.codec import PROTOCOL_VERSION

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cartpole-dqn.yaml"
A3C = ROOT / "configs" / "cartpole-a3c.yaml"
BATCH = 64
INT64_MAX, UINT64_MAX = (1 << 63) - 1, (1 << 64) - 1


def start(service: str, run_dir: Path, sets: list[str], config: Path = CONFIG,
          tag: str = "") -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "rlfleet.cli", "service", service, "--config", str(config)]
    for s in [f"run_dir={run_dir}", "network.bind_host=127.0.0.1", "metrics.port=0", *sets]:
        cmd += ["--set", s]
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / f"{service}{tag}.log", "ab")  # noqa: SIM115 (the process owns it)
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def batch(writer: int, start_idx: int) -> dict[str, np.ndarray]:
    idx = np.arange(start_idx, start_idx + BATCH, dtype=np.int64)
    obs = np.stack([idx, idx + 1, idx + 2, idx + 3], axis=1).astype(np.float32)
    return {"obs": obs, "action": idx % 2, "reward": np.ones(BATCH, np.float32), "next_obs": obs + 1,
            "discount": np.full(BATCH, 0.99, np.float32), "version": np.zeros(BATCH, np.int64),
            "writer": np.full(BATCH, writer, np.int32), "idx": idx}


def writer_main(address: str, writer: int, phase: int, seconds: float, out: Any) -> None:
    from rlfleet.common.clients.replay_insert import InsertClient

    acked: dict[int, int] = {}
    sender = f"actor-{writer}/{secrets.token_hex(16)}"
    client = InsertClient(address, sender, on_ack=lambda seq, n: acked.__setitem__(seq, n))
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        client.insert("main", batch(writer, (phase * 10_000_000) + i * BATCH))
        i += 1
    client.flush(60)
    client.close()
    out.put((sender, acked))


class Hostile:
    """The hostile peer's sockets (replay, paramserver, the gradient fleet's paramserver) and what came back."""

    def __init__(self, replay: str, params: str, a3c: str) -> None:
        self.ctx = zmq.Context()
        self.socks: dict[str, zmq.Socket[bytes]] = {}
        for name, address in (("replay", replay), ("paramserver", params), ("a3c_paramserver", a3c)):
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDTIMEO, 1000)
            s.connect(address)
            self.socks[name] = s
        self.replies: dict[str, Counter[str]] = {name: Counter() for name in self.socks}

    def send(self, name: str, msg: Any, **kw: Any) -> None:
        from rlfleet.common.wire.codec import encode

        self.socks[name].send_multipart(encode(msg, **kw) if not isinstance(msg, list) else msg)

    def ask(self, name: str, msg: Any, timeout_s: float = 5.0) -> Any:
        """Send and wait for the reply to this seq (counting the others that come meanwhile)."""
        from rlfleet.common.wire.decoder import decode

        self.send(name, msg)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.socks[name].poll(100):
                reply = decode(self.socks[name].recv_multipart())
                self.count(name, reply)
                if reply.get("ref_seq") == msg.seq:
                    return reply
        return None

    def count(self, name: str, reply: Any) -> None:
        self.replies[name][reply["reason"] if reply.type == "error" else reply.type] += 1

    def drain(self) -> None:
        from rlfleet.common.wire.decoder import decode

        for name, s in self.socks.items():
            while s.poll(0):
                try:
                    self.count(name, decode(s.recv_multipart()))
                except Exception:  # noqa: BLE001 (anything undecodable is just counted)
                    self.replies[name]["undecodable"] += 1

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        self.ctx.term()


POISONS = 6  # NaN, Inf, 1e20, twice the norm bound, a version never held, barrier pushes in workers' names


def poisoned_push(h: Hostile, n: int, which: int, rng: np.random.Generator) -> tuple[str, Any] | None:
    """Poisoned gradients number ``which`` for the gradient fleet's paramserver, on its newest version (None
    until it holds weights)."""
    from rlfleet.common.config.sections import DEFAULT_MAX_GRADIENT_NORM
    from rlfleet.common.wire.codec import Message

    workers: list[str] = []
    if which == 5:  # barrier pushes in the names of its live workers
        info = h.ask("a3c_paramserver", Message("info", {}, sender="h-info", seq=n + 1), 2.0)
        workers = [a[0] for a in (info["stats"].get("actors") or []) if a[1] == "actor"] if info is not None else []
        if not workers:
            return None
    got = h.ask("a3c_paramserver", Message("get", {"have_version": -1}, sender="h-reader", seq=n), 2.0)
    if got is None or got.type != "weights":  # (the newest version last: a push on it is not stale on arrival)
        return None
    body = {"version": got["version"], "num_shards": 1, "layout": got["layout"]}
    grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in got.arrays.items()}
    first = next(iter(grads.values())).reshape(-1)
    tag = secrets.token_hex(4)
    if which == 0:
        first[0] = np.nan
    elif which == 1:
        first[0] = np.inf
    elif which in (2, 5):
        grads = {k: np.full_like(g, 1e20) for k, g in grads.items()}
    elif which == 3:
        norm = float(np.sqrt(sum(float(np.square(g, dtype=np.float64).sum()) for g in grads.values())))
        grads = {k: g * np.float32(2 * DEFAULT_MAX_GRADIENT_NORM / norm) for k, g in grads.items()}
    elif which == 4:
        body["version"] += 10**12
    sender = f"{workers[n % len(workers)]}/{tag}" if which == 5 else f"poison-{tag}"
    if which == 5:
        body["barrier"] = True
    return sender, Message("push_gradients", body, grads)


def hostile_main(replay: str, params: str, a3c: str, stop_at: float, victims: list[str], out: Any) -> None:
    from rlfleet.common.wire.codec import Message

    h = Hostile(replay, params, a3c)
    socks = [h.socks["replay"], h.socks["paramserver"]]
    rng = np.random.default_rng(7)
    good = batch(99, 0)
    arrays = [[k, str(v.dtype), list(v.shape)] for k, v in good.items()]
    frames = [v.tobytes() for v in good.values()]
    big = np.zeros(600 << 20, np.uint8)
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        head = {"v": PROTOCOL_VERSION, "type": "insert", "sender": "", "seq": int(rng.integers(0, 1 << 62)),
                "body": {"table": "main"}, "arrays": arrays}
        kind = n % 10
        try:
            if kind == 0:  # undecodable and rule-breaking headers, to both services
                for s in socks:
                    s.send_multipart([rng.bytes(int(rng.integers(1, 200)))])
                    s.send_multipart([msgpack.packb({**head, "v": "1"})])
            elif kind == 1:  # sender ids that imitate a writer's readable name, seq at the top
                head.update(sender=f"{victims[n % len(victims)]}/{secrets.token_hex(16)}", seq=(1 << 64) - 1)
                socks[0].send_multipart([msgpack.packb(head), *frames])
            elif kind == 2:  # bad content under a writer-like (sender, seq)
                head.update(sender=victims[n % len(victims)], seq=1)
                bad = [*frames[:-1], b"\x00" * (len(frames[-1]) - 1)]
                socks[0].send_multipart([msgpack.packb(head), *bad])
            elif kind == 3:  # ever new sender ids (a first seq below 2^53, as replay takes it: stored)
                head.update(sender=secrets.token_hex(16), seq=int(rng.integers(1, 1 << 52)))
                socks[0].send_multipart([msgpack.packb(head), *frames])
            elif kind == 4 and n % 60 == 4:  # an oversized single frame, now and then
                socks[0].send_multipart([msgpack.packb(head), big.data], copy=False)
            elif kind == 5:  # a publish to the paramserver that breaks the partition
                socks[1].send_multipart([msgpack.packb({"v": PROTOCOL_VERSION, "type": "publish", "sender": "h",
                                                        "seq": n,
                                                        "body": {"version": n, "layout": "x", "num_shards": 1},
                                                        "arrays": [["w", "float32", [4]]]}), b"\x00" * 16])
            elif kind == 6:  # forged versions: none was published but 0
                forged = dict(good, version=np.full(BATCH, [10**12, INT64_MAX, -1, -INT64_MAX - 1][n // 10 % 4],
                                                    np.int64))
                h.send("replay", Message("insert", {"table": "main"}, forged, sender=f"forger-{n}/x", seq=1))
            elif kind == 7:  # poisoned gradients to the gradient-worker fleet, on its newest version (not stale)
                poison = poisoned_push(h, n * 1000, n // 10 % POISONS, rng)
                if poison is not None:
                    sender, msg = poison
                    h.send("a3c_paramserver", Message(msg.type, {**msg.body, "window_start": n}, msg.arrays,
                                                      sender=sender, seq=n))
            elif kind == 8:  # registry overflow: new ids, steps and versions at the top of the range
                who = f"squatter-{n}"
                role = "actor" if n % 20 == 8 else "evaluator"
                h.send("a3c_paramserver", Message("hello", {"actor_id": who, "role": role}, sender=who, seq=n))
                h.send("a3c_paramserver", Message("heartbeat", {"actor_id": who, "role": role, "version": INT64_MAX,
                                                                "env_steps": INT64_MAX}, sender=who, seq=n + 1))
                over = {"v": PROTOCOL_VERSION, "type": "heartbeat", "sender": who, "seq": n + 2, "arrays": [],
                        "body": {"actor_id": who, "role": role, "version": 0, "env_steps": UINT64_MAX}}
                h.socks["a3c_paramserver"].send_multipart([msgpack.packb(over)])
            else:  # seq-window spoofing under guessed writer ids
                victim = victims[n % len(victims)]
                now_us = time.time_ns() // 1000
                for sender, seq, ws in ((f"{victim}/{secrets.token_hex(16)}", 1 << 63, None),
                                        (victim, now_us + 2 * 4096 + 1, None), (victim, now_us + 10**6, None),
                                        (f"{victim}/spoof", now_us, UINT64_MAX)):
                    body: dict[str, Any] = {"table": "main"} if ws is None else {"table": "main", "window_start": ws}
                    h.send("replay", Message("insert", body, good, sender=sender, seq=seq))
        except zmq.Again:
            pass
        h.drain()
    # the registry still answers a newcomer (one heartbeat used to break it for everyone)
    hello = h.ask("a3c_paramserver", Message("hello", {"actor_id": "late-actor", "role": "evaluator"},
                                             sender="late-actor", seq=1), 10.0)
    beat = h.ask("a3c_paramserver", Message("heartbeat", {"actor_id": "late-actor", "role": "evaluator",
                                                          "version": 0, "env_steps": 5},
                                            sender="late-actor", seq=2), 10.0)
    h.drain()
    out.put({"registry_ok": all(r is not None and r.type == "welcome" for r in (hello, beat)),
             "hostile_cpu_s": round(time.process_time(), 1),
             "replies": {k: dict(v.most_common()) for k, v in h.replies.items()}})
    h.close()


def run_writers(address: str, writers: int, phase: int, seconds: float) -> dict[str, dict[int, int]]:
    q: Any = mp.get_context("spawn").Queue()
    procs = [mp.get_context("spawn").Process(target=writer_main, args=(address, w, phase, seconds, q))
             for w in range(writers)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join(30)
    return got


def stored(run_dir: Path, writers: int) -> tuple[dict[tuple[str, int], tuple[int, int]], int, int]:
    """(sender, seq) -> (items, writer) of every insert in the log; how many of the writers' transitions it
    holds twice (the hostile's own batches, writer 99, are accepted inserts of its own: not counted); and
    how many items it holds with a version other than 0 (the only one published)."""
    from rlfleet.services.replay.storage import read_log_file

    inserts: dict[tuple[str, int], tuple[int, int]] = {}
    seen: Counter[tuple[int, int]] = Counter()
    forged = 0
    for path in sorted(run_dir.rglob("wal-*.log")):
        for header, arrays in read_log_file(path):
            if header.get("op") == "insert":
                inserts[(header["sender"], int(header["seq"]))] = (len(arrays["idx"]), int(arrays["writer"][0]))
                mine = arrays["writer"] < writers
                seen.update(zip(arrays["writer"][mine].tolist(), arrays["idx"][mine].tolist(), strict=True))
                forged += int(np.count_nonzero(arrays["version"] != 0))
    return inserts, sum(c - 1 for c in seen.values() if c > 1), forged


def evaluate(weights: dict[str, np.ndarray] | None, episodes: int = 10) -> float:
    """Mean greedy return of the A3C CartPole policy with ``weights`` (None: the untrained model)."""
    import gymnasium as gym

    from rlfleet.common import config as config_mod
    from rlfleet.common.envs import acting_policy

    policy = acting_policy(config_mod.load(str(A3C), environ={}))
    if weights is not None:
        policy.load_weights(weights)
    env = gym.make("CartPole-v1")
    total = 0.0
    for ep in range(episodes):
        obs, _ = env.reset(seed=10_000 + ep)
        done = False
        while not done:
            action, _ = policy.act(np.asarray(obs, np.float32)[None], deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(int(action[0]))
            total += float(reward)
            done = terminated or truncated
    env.close()
    return total / episodes


class GradientFleet:
    """A paramserver of the A3C CartPole config and its gradient workers, as processes."""

    def __init__(self, run_dir: Path, workers: int) -> None:
        from rlfleet.common.wire.transport import free_tcp_port

        self.run_dir = run_dir
        self.address = f"tcp://127.0.0.1:{free_tcp_port()}"
        sets = [f"network.paramserver=[{self.address}]", f"network.replay=[tcp://127.0.0.1:{free_tcp_port()}]"]
        self.started = time.monotonic()
        self.paramserver = start("paramserver", run_dir, sets, A3C)
        self.workers = [start("actor", run_dir, sets, A3C, tag=f"-{i}") for i in range(workers)]

    def weights(self, timeout_s: float = 10.0) -> tuple[int, dict[str, np.ndarray]] | None:
        from rlfleet.common.clients.weights_reader import WeightsReader
        from rlfleet.common.wire.errors import CommTimeout, RemoteError

        reader = WeightsReader([self.address], f"bench-reader-{secrets.token_hex(4)}", shm=False)
        try:
            return reader.get(-1, timeout_s=timeout_s)
        except (CommTimeout, RemoteError):
            return None
        finally:
            reader.close()

    def wait_training(self, min_version: int = 20, timeout_s: float = 120.0) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            got = self.weights(2.0)
            if got is not None and got[0] >= min_version:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the gradient-worker fleet did not reach version {min_version} in {timeout_s} s")

    def result(self, at_age_s: float) -> dict[str, Any]:
        """The version its paramserver holds, whether every weight is finite, the workers' training curve
        (mean return of their first and last 50 episodes, from their episodes CSVs) and a greedy evaluation
        of the weights held now (one moment of a policy that moves hundreds of versions a second), once the
        fleet has trained for ``at_age_s`` since it started (the same in both phases)."""
        time.sleep(max(0.0, self.started + at_age_s - time.monotonic()))
        age = time.monotonic() - self.started
        got = self.weights()
        episodes: list[tuple[float, float]] = []
        for path in (self.run_dir / "episodes").glob("*.csv"):
            with open(path) as f:
                episodes += [(float(r["wall_s"]), float(r["episode_return"])) for r in csv.DictReader(f)]
        returns = [r for _, r in sorted(episodes)]
        curve = {"trained_s": round(age, 1), "episodes": len(returns),
                 "first50_return": round(float(np.mean(returns[:50])), 1) if returns else None,
                 "last50_return": round(float(np.mean(returns[-50:])), 1) if returns else None}
        if got is None:
            return {"version": None, "weights_finite": None, **curve, "eval_return": None}
        version, weights = got
        finite = all(bool(np.isfinite(w).all()) for w in weights.values())
        return {"version": version, "weights_finite": finite, **curve,
                "eval_return": round(evaluate(weights), 1) if finite else None}

    def stop(self) -> None:
        for p in [*self.workers, self.paramserver]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [*self.workers, self.paramserver]:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    from rlfleet.common.clients.weights_publisher import WeightsPublisher
    from rlfleet.common.wire.transport import free_tcp_port

    run_dir = Path(tempfile.mkdtemp(prefix="hostile-"))
    replay, params = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    sets = [f"network.replay=[{replay}]", f"network.paramserver=[{params}]", "replay.durability=wal",
            "replay.tables.0.kind=uniform", "replay.tables.0.capacity=1000000", "replay.tables.0.min_size=1",
            "replay.tables.0.samples_per_insert=null", "replay.checkpoint_every_s=3600",
            "replay.tables.0.columns=first_insert"]  # the writers' own columns
    # the table (1M items) is full well before the attack: its growth is not counted in replay's rss_growth_mb
    # (the log keeps every insert: it is read back whole)
    services = {name: start(name, run_dir, sets) for name in ("replay", "paramserver")}
    fleets: list[GradientFleet] = []
    fleet_results: dict[str, Any] = {"untrained_eval_return": round(evaluate(None), 1)}
    report: dict[str, Any] = {}
    try:
        time.sleep(6.0)  # both up (the writers' clients wait for replay anyway)
        publisher = WeightsPublisher([params], "bench-publisher", shm=False)
        publisher.publish(0, {"w": np.zeros(4, np.float32)}, timeout_s=30)  # the one version writers act with
        publisher.close()
        fleets.append(GradientFleet(run_dir / "a3c-quiet", args.workers))
        fleets[0].wait_training()
        quiet = run_writers(replay, args.writers, 0, args.seconds)
        train_s = 2 * args.seconds + 25  # what the attacked phase takes (the attack outlasts the writers by 5 s)
        fleet_results["quiet"] = fleets[0].result(train_s)
        fleets.pop().stop()
        fleets.append(fleet := GradientFleet(run_dir / "a3c-attacked", args.workers))
        fleet.wait_training()
        before = {name: rss_mb(p.pid) for name, p in services.items()}
        before["a3c_paramserver"] = rss_mb(fleet.paramserver.pid)
        stop_at = time.monotonic() + args.seconds + 5
        q: Any = mp.get_context("spawn").Queue()
        hostile = mp.get_context("spawn").Process(
            target=hostile_main,
            args=(replay, params, fleet.address, stop_at, [f"actor-{w}" for w in range(args.writers)], q))
        hostile.start()
        attacked = run_writers(replay, args.writers, 1, args.seconds)
        report = q.get(timeout=120)
        hostile.join(60)
        after = {name: rss_mb(p.pid) for name, p in services.items()}
        after["a3c_paramserver"] = rss_mb(fleet.paramserver.pid)
        alive = {name: p.poll() is None for name, p in services.items()}
        alive["a3c_paramserver"] = fleet.paramserver.poll() is None
        alive["a3c_workers"] = all(p.poll() is None for p in fleet.workers)
        fleet_results["attacked"] = fleet.result(train_s)
        held, twice, forged = stored(run_dir, args.writers)  # before the stop: a final snapshot may retire log segments
    finally:
        for f in fleets:
            f.stop()
        for p in services.values():
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    acked = {(s, seq): (n, int(s.split("/")[0].split("-")[1]))
             for phase in (quiet, attacked) for s, log in phase.items() for seq, n in log.items()}
    lost = sum(1 for key, want in acked.items() if held.get(key) != want)
    rate = {name: sum(len(log) for log in phase.values()) / args.seconds
            for name, phase in (("quiet", quiet), ("attacked", attacked))}
    untrained = fleet_results["untrained_eval_return"]
    print(json.dumps({
        "writers": args.writers, "seconds": args.seconds, "acked_inserts": len(acked),
        "acked_lost": lost, "duplicates_stored": twice, "forged_versions_stored": forged,
        "valid_inserts_per_s": {k: round(v, 1) for k, v in rate.items()},
        "valid_throughput_ratio": round(rate["attacked"] / rate["quiet"], 3) if rate["quiet"] else None,
        # improving: under attack its workers' last 50 episodes return more than their first 50 and than the
        # untrained model's greedy return
        "gradient_fleet": {**fleet_results, "improved_under_attack": bool(
            fleet_results["attacked"]["weights_finite"]
            and (fleet_results["attacked"]["last50_return"] or 0) > max(
                untrained, fleet_results["attacked"]["first50_return"] or 0))},
        "registry_ok": report.get("registry_ok"),
        "hostile_cpu_s": report.get("hostile_cpu_s"),  # what the attacker itself took of the machine's cores
        "rss_growth_mb": {k: round(after[k] - before[k], 1) for k in before},
        "services_alive": alive,
        "replies": report.get("replies"),
    }))


if __name__ == "__main__":
    main()
