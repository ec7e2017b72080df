"""A cost model of the fleet from measured per-component costs, checked against measured runs.

    .venv/bin/python -m bench.fleet.cost_model [--seconds 20] [--docs]

1. Components, each measured alone in this process (one thread; CartPole, Ape-X DQN as
   configs/cartpole-dqn.yaml):
   - ``act``: an actor's CPU per env step: policy act, env step, n-step adder, and its share of
     encoding an insert (64 transitions); ``act_2ms``: the wall time of the same on an env that
     sleeps 2 ms per step (what the sleep really takes included);
   - ``insert``: replay's CPU per stored transition (decode, check, copy into the table);
   - ``sample``: replay's CPU per sampled batch (select, gather, encode); ``learner_io``: the
     learner's per update beside learning (decode the batch, encode the priorities);
   - ``update(b)``: one learner update on a batch of b (b = 256, 128);
   - ``allreduce``: averaging one update's gradients over 2 learner ranks (bench.learning.learners' way);
   - ``publish``: one weights version published and fetched by one actor.
2. In the fleet, the same work costs more: each member's CPU seconds (read from /proc over the
   steady half of a run, bench/fleet/fleet_cpu.py) per unit of its work. Three calibration runs give them:
   1 actor at 2 ms per env step (k = 16, bench.learning.scaling's settings), 2 actors without latency with
   1 learner (k = 32), and 1 actor with 2 learners (k = 32). Per unit: an actor's CPU and wall
   seconds per env step of its own; replay's CPU per env step and per sample request (the 1-actor
   and the 2-learner runs, two unknowns); the paramserver's per env step and per update (the same
   two); the learner's CPU per update and the share of its wall time it is busy (the rest it waits
   for batches). ``overhead`` = the learner's CPU per update in the fleet minus ``update_256`` +
   ``learner_io`` alone: its loop (sample client, priorities, publishing, metrics).
   ``allreduce_fleet``: a rank's CPU per update in the 2-learner run beyond that of one learner's
   (update_128 in place of update_256): the all-reduce among busy neighbours (alone: ``allreduce``).
3. The model, for A actors (each stepping an env of ``latency`` per step), L learners, a global
   batch B and k samples per insert (replay's rate limiter: B / k env steps per update):
   - a rank's CPU per update: c_L = update(B / L) + learner_io + overhead + allreduce_fleet (L > 1);
   - actors: E_act = A / (an actor's wall seconds per env step) env steps/s (each one serial loop);
   - learners: U_max = busy / c_L updates/s (L ranks in lockstep: one update each per global update);
   - replay (one process, one core): E x insert + U x L x sample <= 1 s per s (each rank samples its share);
   - cores: everything beside the env's sleep shares P cores:
     E x (act + insert + ps_step) + U x (L x (c_L + sample) + ps_update) <= P;
   - lockstep (L > 1): the ranks meet at an all-reduce every update, so the other members' CPU per
     update W (actors, replay, paramserver) that does not fit on the P - L spare cores preempts a rank
     and stalls them all: T = c_L + max(0, W - (P - L) x T) seconds per update;
   - and U = E x k / B (the limiter). E is the largest rate all of them allow; the first to bind
     is what saturates.
4. Checked against ``rlfleet up`` runs of 1, 2, 4 and 8 actors at 2 ms per env step, and without
   latency of 1 learner with 2 actors and of 2 learners with 1, 2 and 4 actors (k = 32) and with 2
   actors at k = 16 and 64 (more or less of the other members' work per update: the lockstep term):
   the steady env steps/s and updates/s of each run (the mean over its last ``--seconds`` / 2 s)
   against the model's for P = this machine's cores; error = predicted / measured - 1 (goal: within
   25%). The calibration runs hold by construction, bar the bound that binds; the others are
   predictions.
5. Projected to 256 actors and 8 learners across hosts (each actor a core of its own, each
   learner a host paying the all-reduce measured alone, replay a core): which component saturates
   first.

Last line: one JSON object. ``--docs`` writes docs/cost_model.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.fleet import fleet_cpu
from bench.learning.learners import run as run_learners

CONFIG = "configs/cartpole-dqn.yaml"
LATENCY_S = 0.002
ACTOR_SETS = ["algorithm.batch_size=256", "replay.tables.0.samples_per_insert=16", "actor.poll_every=10",
              "algorithm.epsilon_alpha=0", "evaluator.enabled=false", "env.step_latency_ms=2"]
LEARNER_SETS = ["algorithm.batch_size=256", "evaluator.enabled=false"]


def per_call(fn: Any, n: int, warm: int = 20) -> float:
    for _ in range(warm):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def components() -> dict[str, float]:
    """Seconds per unit of each component, measured alone."""
    import torch

    from rlfleet.common import algorithms
    from rlfleet.common import config as config_mod
    from rlfleet.common.algorithms.importance import importance_weights
    from rlfleet.common.envs import acting_policy, make_vector_env
    from rlfleet.common.wire.codec import Message, encode
    from rlfleet.common.wire.decoder import decode
    from rlfleet.common.wire.inserts import InsertEncoder
    from rlfleet.services.replay.tables import make_table

    torch.set_num_threads(1)
    cfg = config_mod.load(CONFIG, environ={})
    algo = algorithms.get(cfg.algorithm.name)
    envs = make_vector_env(cfg.env, 0, algo.autoreset_mode)
    policy = acting_policy(cfg, act_seed=0)
    adder = algo.make_adder(cfg.algorithm, cfg.env.num_envs, envs.single_observation_space,
                            envs.single_action_space, algo.autoreset_mode)
    obs, _ = envs.reset(seed=0)
    adder.reset(obs)
    state = {"obs": obs}
    items: list[dict[str, np.ndarray]] = []

    def act() -> None:
        actions, extras = policy.act(state["obs"])
        state["obs"], rewards, terminated, truncated, infos = envs.step(actions)
        out = adder.add(actions, extras, state["obs"], rewards, terminated, truncated, infos, 0)
        if len(out["version"]):
            items.append(out)

    act_s = per_call(act, 3000) / cfg.env.num_envs
    batch = {k: np.concatenate([i[k] for i in items])[:64] for k in items[0]}
    encoder = InsertEncoder()
    seq = iter(range(1, 10**9))
    encode_s = per_call(lambda: encoder.frames("main", batch, "a/1", next(seq), 1), 2000) / 64
    frames = [bytes(f) for f in encoder.frames("main", batch, "a/1", 1, 1)]
    table = make_table(cfg.replay.tables[0])

    def insert() -> None:
        msg = decode(frames)
        table.check(msg.arrays)
        table.insert(msg.arrays, np.ones(64))

    insert_s = per_call(insert, 2000) / 64

    def sample() -> None:
        s = table.sample(256)
        arrays = {"key": s.keys, "probability": s.probability, **s.data}
        encode(Message("batch", {"ref_seq": 1, "table": "main", "shard": 0, "table_size": table.size}, arrays))

    sample_s = per_call(sample, 500)
    s0 = table.sample(256)
    head = {"ref_seq": 1, "table": "main", "shard": 0, "table_size": table.size}
    reply = [bytes(f) for f in encode(Message("batch", head, {"key": s0.keys, "probability": s0.probability,
                                                              **s0.data}))]
    keys, prios = s0.keys, np.ones(256, np.float32)

    def learner_io() -> None:  # what the learner does per update beside learn(): decode, weights, priorities back
        importance_weights(decode(reply).arrays["probability"], 0.4)
        encode(Message("priorities", {"table": "main"}, {"key": keys, "priority": prios}))

    learner_io_s = per_call(learner_io, 500)
    env = envs.single_observation_space, envs.single_action_space
    envs.close()
    update = {}
    rng = np.random.default_rng(0)
    for b in (256, 128):
        core = algo.make_learner(cfg.algorithm.model_copy(update={"batch_size": b}), *env, device="cpu", seed=0)
        data = {"obs": rng.normal(size=(b, 4)).astype(np.float32), "action": rng.integers(2, size=b),
                "reward": rng.normal(size=b).astype(np.float32), "next_obs": rng.normal(size=(b, 4)).astype(np.float32),
                "discount": np.full(b, 0.99, np.float32), "version": np.zeros(b, np.int64)}
        weights = np.ones(b, np.float32)
        update[b] = per_call(lambda c=core, d=data, w=weights: c.learn(d, w), 300)
    publish_s = _publish_cost(core.weights())
    return {"act": act_s + encode_s, "act_2ms": _act_with_latency(cfg) + encode_s, "insert": insert_s,
            "sample": sample_s, "learner_io": learner_io_s, "update_256": update[256], "update_128": update[128],
            "publish": publish_s}


def _act_with_latency(cfg: Any, seconds: float = 2.0) -> float:
    """Wall seconds per env step of the same loop on an env of 2 ms per step (the sleep overshoots)."""
    from rlfleet.common import algorithms
    from rlfleet.common import config as config_mod
    from rlfleet.common.envs import acting_policy, make_vector_env

    slow = config_mod.load(CONFIG, sets=["env.step_latency_ms=2"], environ={})
    algo = algorithms.get(slow.algorithm.name)
    envs = make_vector_env(slow.env, 0, algo.autoreset_mode)
    policy = acting_policy(slow, act_seed=0)
    obs, _ = envs.reset(seed=0)
    steps, t0 = 0, time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            obs = envs.step(policy.act(obs)[0])[0]
            steps += slow.env.num_envs
    finally:
        envs.close()
    return (time.perf_counter() - t0) / steps


def _publish_cost(weights: dict[str, np.ndarray]) -> float:
    """One version published to a paramserver (in this process) and fetched by one reader."""
    import threading

    from rlfleet.common.clients.weights_publisher import WeightsPublisher
    from rlfleet.common.clients.weights_reader import WeightsReader
    from rlfleet.common.metrics import ServiceMetrics
    from rlfleet.services.paramserver.shard import ShardServer

    server = ShardServer(ServiceMetrics("paramserver"), "tcp://127.0.0.1:0", 0, 1, 5.0, shm=False)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    pub, reader = WeightsPublisher([server.endpoint], "learner"), WeightsReader([server.endpoint], "actor-0")
    version = iter(range(10**9))
    try:
        def once() -> None:
            v = next(version)
            pub.publish(v, weights, timeout_s=10)
            reader.get(v - 1, timeout_s=10)

        return per_call(once, 200)
    finally:
        pub.close()
        reader.close()
        server.stop()
        thread.join(5)
        server.close()


def predict(c: dict[str, float], actors: int, learners: int, latency: float, k: float, batch: int,
            cores: float) -> dict[str, Any]:
    """Env steps/s and updates/s the model allows, and which bound binds (``c``: in-fleet costs)."""
    update = c["update_256"] if batch // learners >= 256 else c["update_128"]
    rank = update + c["learner_io"] + c["overhead"] + (c["allreduce_fleet"] if learners > 1 else 0.0)
    per_env = batch / k  # env steps per update
    bounds = {
        "actors": actors / (c["actor_wall_2ms"] if latency else c["actor_wall"]),
        "learner": per_env * c["learner_busy"] / rank,
        "replay": 1.0 / (c["replay_step"] + learners * c["replay_update"] / per_env),
        "cores": cores / (c["actor_step"] + c["replay_step"] + c["ps_step"]
                          + (learners * (rank + c["replay_update"]) + c["ps_update"]) / per_env),
    }
    if learners > 1:  # ranks in lockstep: other work that takes a rank's core stalls every rank
        other = (c["actor_step"] + c["replay_step"] + c["ps_step"]) * per_env + learners * c["replay_update"] \
            + c["ps_update"]
        bounds["lockstep"] = per_env / lockstep_seconds(rank, other, cores - learners)
    binding = min(bounds, key=lambda name: bounds[name])
    env = bounds[binding]
    return {"env_steps_per_s": env, "updates_per_s": env / per_env, "binds": binding,
            "bounds": {name: round(v, 1) for name, v in bounds.items()}}


def lockstep_seconds(rank: float, other: float, spare: float) -> float:
    """Wall seconds per update of ranks in lockstep (a collective every update) that need ``rank`` CPU
    seconds each, beside ``other`` CPU seconds of other work per update, with ``spare`` cores beyond one
    per rank. Other work runs on the spare cores while it fits; the rest preempts a rank, and every rank
    then waits for it at the next all-reduce: T = rank + max(0, other - spare x T)."""
    spare = max(spare, 0.0)
    return rank if other <= spare * rank else (rank + other) / (1.0 + spare)


def measured(actors: int, learners: int, sets: list[str], seconds: float, root: Path) -> dict[str, Any]:
    """An `rlfleet up` run: env steps/s and updates/s over its steady second half, and the CPU seconds
    per second of each kind of member over the same span."""
    runs = Path(tempfile.mkdtemp(prefix=f"a{actors}-l{learners}-", dir=root))
    cmd = [sys.executable, "-m", "rlfleet.cli", "up", "--config", CONFIG, "--actors", str(actors), "--learners",
           str(learners), "--max-seconds", str(seconds), "--runs", str(runs)]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def last_row(at_least: float) -> dict[str, str]:
        deadline = time.monotonic() + seconds + 180
        while time.monotonic() < deadline:
            found = list(runs.glob("*/progress.csv"))
            rows = list(csv.DictReader(open(found[0]))) if found else []
            if rows and float(rows[-1]["wall_s"]) >= at_least:
                return rows[-1]
            if proc.poll() is not None:
                raise RuntimeError(f"rlfleet up {' '.join(cmd[3:])} ended early (exit {proc.returncode})")
            time.sleep(0.1)
        raise TimeoutError("no progress rows")

    try:
        first = last_row(seconds / 2)
        run_dir = next(runs.glob("*/progress.csv")).parent
        cpu0, t0 = fleet_cpu.snapshot(run_dir), time.monotonic()
        last = last_row(seconds - 1.5)
        cpu1, t1 = fleet_cpu.snapshot(run_dir), time.monotonic()
    finally:
        proc.wait(seconds + 180)
    span = float(last["wall_s"]) - float(first["wall_s"])
    cores: dict[str, float] = {}
    for label, used in cpu1.items():
        kind = label.split("-")[0]
        cores[kind] = cores.get(kind, 0.0) + (used - cpu0.get(label, 0.0)) / (t1 - t0)
    return {"env_steps_per_s": (float(last["env_steps"]) - float(first["env_steps"])) / span,
            "updates_per_s": (float(last["updates"]) - float(first["updates"])) / span, "cores": cores}


def calibrate(alone: dict[str, float], lat: dict[str, Any], busy: dict[str, Any], pair: dict[str, Any],
              learner_cores: float) -> dict[str, float]:
    """In-fleet costs per unit from the three calibration runs: ``lat`` (1 actor, 2 ms per step),
    ``busy`` (2 actors, 1 learner, no latency) and ``pair`` (1 actor, 2 learners: a rank's all-reduce
    in the fleet, what its CPU per update has beyond one learner's)."""
    e1, u1, e2, u2 = lat["env_steps_per_s"], lat["updates_per_s"], busy["env_steps_per_s"], busy["updates_per_s"]
    e3, q3 = pair["env_steps_per_s"], 2 * pair["updates_per_s"]  # q: sample requests/s (one per rank per update)
    # replay and paramserver: r = E x per_step + Q x per_request, from the 1-actor run (mostly inserts) and
    # the 2-learner run (a request per rank per update); with the 1-learner run in its place the two
    # equations gave a negative cost per request
    r1, r3 = lat["cores"].get("replay", 0.0), pair["cores"].get("replay", 0.0)
    replay_update = (r3 - r1 * e3 / e1) / (q3 - u1 * e3 / e1)
    replay_step = (r1 - u1 * replay_update) / e1
    p1, p3 = lat["cores"].get("paramserver", 0.0), pair["cores"].get("paramserver", 0.0)
    ps_update = max(0.0, (p3 - p1 * e3 / e1) / (pair["updates_per_s"] - u1 * e3 / e1))
    learner = busy["cores"]["learner"] / u2
    return {**alone,
            "actor_step": busy["cores"]["actor"] / e2, "actor_wall": 2 / e2, "actor_wall_2ms": 1 / e1,
            "replay_step": max(replay_step, 0.0), "replay_update": max(replay_update, 0.0),
            "ps_step": max(0.0, (p1 - u1 * ps_update) / e1), "ps_update": ps_update,
            "overhead": max(0.0, learner - alone["update_256"] - alone["learner_io"]),
            "learner_busy": min(1.0, busy["cores"]["learner"] / learner_cores),
            "allreduce_fleet": max(0.0, pair["cores"]["learner"] / 2 / pair["updates_per_s"] - alone["update_128"]
                                   - alone["learner_io"] - (learner - alone["update_256"] - alone["learner_io"]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each checking run")
    ap.add_argument("--docs", action="store_true", help="write docs/cost_model.md")
    args = ap.parse_args()
    cores = float(os.cpu_count() or 1)
    c = components()
    lr = run_learners(2, 1, argparse.Namespace(algo="dqn", batch=256, hidden=128, updates=200, threads=1))
    c["allreduce"] = lr["ours_allreduce_ms"] / 1000
    # (check, actors, learners, samples per insert k, calibration); the actor rows step a 2 ms env
    specs = [("actors", 1, 1, 16, True), ("actors", 2, 1, 16, False), ("actors", 4, 1, 16, False),
             ("actors", 8, 1, 16, False), ("learners", 2, 1, 32, True), ("learners", 1, 2, 32, True),
             ("learners", 2, 2, 32, False), ("learners", 4, 2, 32, False), ("learners", 2, 2, 16, False),
             ("learners", 2, 2, 64, False)]
    runs = []
    with tempfile.TemporaryDirectory(prefix="cost-model-") as tmp:
        for kind, actors, learners, k, _ in specs:
            sets = ACTOR_SETS if kind == "actors" else LEARNER_SETS + [f"replay.tables.0.samples_per_insert={k}"]
            runs.append(measured(actors, learners, sets, args.seconds, Path(tmp)))
    alone = dict(c)
    by_spec = {spec[:4]: m for spec, m in zip(specs, runs, strict=True)}
    c = calibrate(alone, by_spec["actors", 1, 1, 16], by_spec["learners", 2, 1, 32], by_spec["learners", 1, 2, 32],
                  learner_cores=1.0)
    table = []
    for (kind, actors, learners, k, calibration), m in zip(specs, runs, strict=True):
        p = predict(c, actors, learners, LATENCY_S if kind == "actors" else 0.0, k, 256, cores)
        table.append({"check": kind, "actors": actors, "learners": learners, "samples_per_insert": k,
                      "calibration": calibration,
                      "measured_env_steps_per_s": round(m["env_steps_per_s"], 1),
                      "predicted_env_steps_per_s": round(p["env_steps_per_s"], 1),
                      "env_error": round(p["env_steps_per_s"] / m["env_steps_per_s"] - 1, 3),
                      "measured_updates_per_s": round(m["updates_per_s"], 1),
                      "predicted_updates_per_s": round(p["updates_per_s"], 1),
                      "updates_error": round(p["updates_per_s"] / max(m["updates_per_s"], 1e-9) - 1, 3),
                      "binds": p["binds"], "cores_used": {k: round(v, 2) for k, v in m["cores"].items()}})
    # across hosts: every actor its own core, each learner a host of its own, replay one core
    projection = {}
    for actors, learners in ((256, 1), (256, 8)):
        p = predict({**c, "allreduce_fleet": c["allreduce"]}, actors, learners, LATENCY_S, 16, 256,
                    cores=float(actors + learners + 1))
        projection[f"{actors}_actors_{learners}_learners"] = {
            "env_steps_per_s": round(p["env_steps_per_s"], 1), "updates_per_s": round(p["updates_per_s"], 1),
            "binds": p["binds"], "bounds": p["bounds"]}
    result = {"cores": cores, "components_ms": {k: round(v * 1000, 4) for k, v in alone.items()},
              "in_fleet_ms": {k: round(v * 1000, 4) for k, v in c.items() if k not in alone and k != "learner_busy"},
              "learner_busy": round(c["learner_busy"], 3),
              "checks": table,
              "max_abs_error": round(max(max(abs(r["env_error"]), abs(r["updates_error"])) for r in table
                                         if not r["calibration"]), 3),
              "projection": projection}
    if args.docs:
        write_docs(result)
    print(json.dumps(result))


def write_docs(result: dict[str, Any]) -> None:
    lines = ["# Cost model", "",
             "`.venv/bin/python -m bench.fleet.cost_model --docs` (see its docstring for the model).",
             "", "Components (ms per unit, measured alone, one thread):", "",
             "| component | ms |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in result["components_ms"].items()]
    lines += ["", "In the fleet (CPU ms per unit, from /proc over the calibration runs' steady halves; the learner "
              f"was busy {result['learner_busy']:.0%} of its wall time):", "", "| cost | ms |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in result["in_fleet_ms"].items()]
    lines += ["", f"Checks on this machine ({result['cores']:g} cores; *calibration*: the run the in-fleet costs "
              f"come from; the others are predictions, largest error {result['max_abs_error']:+.1%}):", "",
              "| check | actors | learners | samples per insert | env steps/s measured | predicted | error | "
              "updates/s measured | predicted | error | binds | cores used |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in result["checks"]:
        used = ", ".join(f"{k} {v}" for k, v in sorted(r["cores_used"].items()))
        kind = f"*{r['check']} (calibration)*" if r["calibration"] else r["check"]
        lines.append(f"| {kind} | {r['actors']} | {r['learners']} | {r['samples_per_insert']} | "
                     f"{r['measured_env_steps_per_s']} | "
                     f"{r['predicted_env_steps_per_s']} | {r['env_error']:+.1%} | {r['measured_updates_per_s']} | "
                     f"{r['predicted_updates_per_s']} | {r['updates_error']:+.1%} | {r['binds']} | {used} |")
    lines += ["", "Projection across hosts (each actor a core, each learner a host, replay a core):", ""]
    for name, p in result["projection"].items():
        lines.append(f"- {name.replace('_', ' ')}: {p['env_steps_per_s']} env steps/s, {p['updates_per_s']} "
                     f"updates/s; saturates first: **{p['binds']}** (bounds {p['bounds']})")
    lines += ["", "```json", json.dumps(result), "```", ""]
    Path("docs/cost_model.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
