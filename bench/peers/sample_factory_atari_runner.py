"""Sample Factory 2.1.1 APPO on Pong, env frames/s: the peer of bench.learning.pixels --peer sample-factory.

    .peers/sample-factory/bin/python bench/peers/sample_factory_atari_runner.py --workers N --seconds S

Sample Factory's own tuned Atari example (sf_examples/atari: ``atari_override_defaults``, the settings its
Atari results were reported with: the Nature CNN, frame skip 4 and a stack of 4, 84x84 greyscale, rollouts
of 128, batches of 256, 4 epochs, one env per worker, synchronous collection) on ``atari_pong``
(PongNoFrameskip-v4, ale-py 0.9.1 under gymnasium 0.29.1), with ``--workers`` rollout workers (the env
processes; its policy worker and learner are processes of their own, as rlfleet's learner, replay and
paramserver are), CPU only, no checkpoints or summaries beyond its defaults' cadence. It trains for
``--seconds`` from the moment its runner starts; at each training step it records the learner's env steps,
which Sample Factory counts in env frames (``summaries_use_frameskip``, its default for Atari). The figure
is frames/s over the run's steady part (the first quarter left out), as bench.learning.pixels takes
rlfleet's. ``--envs-per-worker K`` runs it as its docs tune for throughput instead (K envs a worker in two
halves that alternate, double-buffered sampling, asynchronous collection), the other settings the same.
Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any


def make_env(full_env_name: str, cfg: Any = None, env_config: Any = None, render_mode: str | None = None) -> Any:
    """Sample Factory's Atari env with ale-py's envs registered first: gymnasium 0.29 does not import ale-py
    itself, and Sample Factory's worker processes are spawned (module level: they unpickle it)."""
    import ale_py  # noqa: F401
    from sf_examples.atari.atari_utils import make_atari_env

    return make_atari_env(full_env_name, cfg, env_config, render_mode)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, required=True, help="rollout worker processes (env processes)")
    ap.add_argument("--seconds", type=float, required=True, help="how long it trains")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--envs-per-worker", type=int, default=None,
                    help="throughput settings: this many envs a worker (even), worker_num_splits 2, async_rl")
    args = ap.parse_args()

    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.misc import ExperimentStatus
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner
    from sf_examples.atari.train_atari import parse_atari_args

    register_env("atari_pong", make_env)
    train_dir = tempfile.mkdtemp(prefix="sf-pixels-")
    argv = ["--env=atari_pong", "--algo=APPO", f"--seed={args.seed}", f"--num_workers={args.workers}",
            f"--train_dir={train_dir}", "--experiment=pixels", "--device=cpu", "--restart_behavior=overwrite",
            "--save_every_sec=1000000", "--save_best_every_sec=1000000"]
    if args.envs_per_worker is not None:
        if args.envs_per_worker < 2 or args.envs_per_worker % 2:
            raise SystemExit(f"--envs-per-worker {args.envs_per_worker}: an even number >= 2 (two halves)")
        argv += [f"--num_envs_per_worker={args.envs_per_worker}", "--worker_num_splits=2", "--async_rl=True"]
    cfg = parse_atari_args(argv)
    records: list[tuple[float, int]] = []

    class Clock(AlgoObserver):  # type: ignore[misc]
        """Records (seconds, env frames) at every training step; stops the run after ``--seconds``."""

        def __init__(self) -> None:
            self.start: float | None = None

        def on_training_step(self, runner: Any, training_iteration_since_resume: int) -> None:
            now = time.monotonic()
            if self.start is None:
                self.start = now
            records.append((now - self.start, int(runner.env_steps.get(0, 0))))
            if now - self.start >= args.seconds:
                runner._stop_training()

    cfg, runner = make_runner(cfg)
    runner.register_observer(Clock())
    status = runner.init()
    if status == ExperimentStatus.SUCCESS:
        status = runner.run()
    steady = [r for r in records if r[0] >= args.seconds / 4]
    frames_per_s = None
    if len(steady) >= 2 and steady[-1][0] > steady[0][0]:
        frames_per_s = (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
    print(json.dumps({"peer": "sample-factory", "algo": "APPO", "env": "PongNoFrameskip-v4", "workers": args.workers,
                      "seconds": round(records[-1][0], 1) if records else 0.0,
                      "env_frames": records[-1][1] if records else 0,
                      "frames_per_s": None if frames_per_s is None else round(frames_per_s, 1),
                      "envs_per_worker": cfg.num_envs_per_worker,
                      "worker_num_splits": cfg.worker_num_splits, "batch_size": cfg.batch_size,
                      "rollout": cfg.rollout, "async_rl": cfg.async_rl,
                      "sample_factory_status": int(status)}))


if __name__ == "__main__":
    main()
