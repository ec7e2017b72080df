"""Async publishing off the training thread: what it costs the learner's updates on this CPU.

    .venv/bin/python -m bench.learning.publish_overlap [--rounds 7] [--updates 150] [--every 10]

The async learner publishes every ``learner.publish_every`` updates. This bench runs the learner's
real update (a DQN learner, ``core.learn`` on pre-sampled batches, as in bench.learning.learners)
against a real paramserver shard process on this host, three ways side by side:

- ``none``: updates only, no publishing: the ceiling;
- ``inline``: every ``--every`` updates, ``core.weights()`` and ``WeightsPublisher.publish`` on the
  training thread, waiting for the ack (what the learner did before);
- ``background``: the learner's way now: every ``--every`` updates a version is due; once the
  publish thread (``BackgroundPublisher``) is free the training thread takes the snapshot and
  hands it over, and goes on training while it is sent.

For each model (the DQN MLP at 256 units, ~68k parameters, and a 1024-unit one, ~1.05M) the sides
run in ``--rounds`` rounds of ``--updates`` updates each, the sides' order rotating every round so a
noisy stretch of the machine falls on all of them. Figures: each side's median updates/s over the
rounds, ``<side>_over_none`` the median of the rounds' ratios to ``none`` (the issue's "costs nothing
on CPU": ``background_over_none`` near 1), publishes per round, and ``background_over_inline``.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from typing import Any

import numpy as np
import torch

from bench.learning.learners import batch_for, make_core
from harness.paramserver_procs import ShardProcesses
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.services.learner.publishing import BackgroundPublisher

SIDES = ("none", "inline", "background")
PUBLISH_TIMEOUT_S = 30.0


class Side:
    """One way of publishing while training; :meth:`round` times ``updates`` updates."""

    def __init__(self, name: str, core: Any, batches: list[dict[str, np.ndarray]], address: str, every: int,
                 versions: itertools.count[int]) -> None:
        self.name, self.core, self.batches, self.every = name, core, batches, every
        self.versions = versions  # shared by the sides: one paramserver, versions only grow
        self.inline = WeightsPublisher([address], "inline") if name == "inline" else None
        self.background = BackgroundPublisher(WeightsPublisher([address], "background"),
                                              lambda _w: PUBLISH_TIMEOUT_S) if name == "background" else None

    def round(self, updates: int) -> tuple[float, int]:
        """(updates/s, versions published) over ``updates`` updates."""
        published = 0
        due = False
        t0 = time.perf_counter()
        for i in range(1, updates + 1):
            self.core.learn(self.batches[i % len(self.batches)])
            if i % self.every:
                continue
            if self.inline is not None:
                self.inline.publish(next(self.versions), self.core.weights(), timeout_s=PUBLISH_TIMEOUT_S)
                published += 1
            elif self.background is not None:
                due = True
            if due and self.background is not None and not self.background.busy:
                self.background.submit(next(self.versions), self.core.weights())
                due = False
        rate = updates / (time.perf_counter() - t0)
        if self.background is not None:
            self.background.wait_idle(PUBLISH_TIMEOUT_S)
            outcomes = self.background.drain()
            assert all(o.error is None for o in outcomes), [o.error for o in outcomes if o.error]
            published = len(outcomes)
        return rate, published

    def close(self) -> None:
        if self.inline is not None:
            self.inline.close()
        if self.background is not None:
            self.background.close(PUBLISH_TIMEOUT_S)


def run_model(hidden: int, args: argparse.Namespace) -> dict[str, Any]:
    core = make_core("dqn", args.batch, hidden, 1)
    params = sum(int(w.size) for w in core.weights().values())
    rng = np.random.default_rng(0)
    batches = [batch_for("dqn", args.batch, rng) for _ in range(8)]
    for i in range(30):  # warm-up
        core.learn(batches[i % len(batches)])
    rates: dict[str, list[float]] = {s: [] for s in SIDES}
    publishes: dict[str, list[int]] = {s: [] for s in SIDES}
    with ShardProcesses(1) as shards:
        shards.wait_ready()
        versions = itertools.count(1)
        sides = {name: Side(name, core, batches, shards.addresses[0], args.every, versions) for name in SIDES}
        try:
            for r in range(args.rounds):
                order = SIDES[r % 3:] + SIDES[:r % 3]
                for name in order:
                    rate, n = sides[name].round(args.updates)
                    rates[name].append(rate)
                    publishes[name].append(n)
        finally:
            for side in sides.values():
                side.close()
    out: dict[str, Any] = {"hidden": hidden, "params": params}
    for name in SIDES:
        out[f"{name}_updates_per_s"] = round(statistics.median(rates[name]), 1)
        out[f"{name}_publishes_per_round"] = statistics.median(publishes[name])
    for name in ("inline", "background"):
        out[f"{name}_over_none"] = round(statistics.median(
            a / b for a, b in zip(rates[name], rates["none"], strict=True)), 3)
    out["background_over_inline"] = round(statistics.median(
        a / b for a, b in zip(rates["background"], rates["inline"], strict=True)), 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--updates", type=int, default=150)
    p.add_argument("--every", type=int, default=10, help="updates between versions (learner.publish_every)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the learner (learner.torch_threads)")
    p.add_argument("--hidden", default="256,1024", help="the MLPs' widths, comma-separated")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    models = [run_model(int(h), args) for h in args.hidden.split(",")]
    for m in models:
        print(f"hidden {m['hidden']} ({m['params']:,} params): " + ", ".join(
            f"{s} {m[f'{s}_updates_per_s']}/s" for s in SIDES)
            + f"; background/none {m['background_over_none']}, inline/none {m['inline_over_none']}", flush=True)
    print(json.dumps({"bench": "publish_overlap", "rounds": args.rounds, "updates": args.updates,
                      "every": args.every, "batch": args.batch, "threads": args.threads, "models": models,
                      "background_over_none": min(m["background_over_none"] for m in models),
                      "background_over_inline": min(m["background_over_inline"] for m in models)}))


if __name__ == "__main__":
    main()
