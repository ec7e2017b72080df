"""The replay service: ``build(cfg, args)`` for common.runtime, and a module entry point.

    python -m services.replay.main --config exp.yaml --shard 0 [--set replay.durability=wal ...]
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

from rlfleet.common.config import Experiment, load
from rlfleet.common.envs import EnvError, experience_spec
from rlfleet.common.exposure import refuse_plain_exposure
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.runtime import FatalError, ServiceArgs, run_service, setup_logging
from rlfleet.common.security import server_curve
from rlfleet.services.replay.columnar import TableError
from rlfleet.services.replay.server import ReplayServer
from rlfleet.services.replay.storage import WalError

log = logging.getLogger("rlfleet.replay")


def shard_dir(cfg: Experiment, shard: int) -> Path:
    """Snapshots and logs of one shard: <run_dir>/<replay.dir>/shard-<k> (replay.dir may be absolute)."""
    return Path(cfg.run_dir) / cfg.replay.dir / f"shard-{shard}"


class ReplayService:
    """One replay shard: the server, its durability, and the Service contract."""

    def __init__(self, cfg: Experiment, args: ServiceArgs, bind: str | None = None) -> None:
        self.cfg = cfg
        self.shard = args.shard
        if not 0 <= args.shard < cfg.replay.shards:
            raise ValueError(f"shard {args.shard} out of range; replay.shards={cfg.replay.shards}")
        self.metrics = ServiceMetrics("replay", args.shard)
        self.bind = bind or cfg.bind_address("replay", args.shard)
        refuse_plain_exposure(cfg, f"replay shard {args.shard}", self.bind, cfg.security.mode == "curve")
        self.server = ReplayServer(
            cfg.replay, self.metrics, self.bind, shard=args.shard, directory=shard_dir(cfg, args.shard),
            seed=cfg.seed * 1000 + args.shard, curve=server_curve(cfg), limits=cfg.limits,
            max_held_inserts=cfg.replay.max_held_inserts, max_held_bytes=cfg.replay.max_held_mib << 20,
            # replay holds no client key to ask a CurveZMQ paramserver: the learner alone drops future versions
            paramserver=cfg.network.paramserver[0] if cfg.security.mode != "curve" else None,
        )
        t0 = time.monotonic()
        restored = self.server.restore()
        if cfg.replay.durability != "memory":
            log.info("replay shard %d: restored %d items from %s in %.2f s %s", args.shard, restored,
                     self.server.dir, time.monotonic() - t0, {n: t.size for n, t in self.server.tables.items()})
        self.restored = restored
        self._declare_schema()
        log.info("replay shard %d: serving on %s, tables %s, durability %s", args.shard, self.server.endpoint,
                 {t.name: f"{t.kind}/{t.capacity}" for t in cfg.replay.tables}, cfg.replay.durability)

    def _declare_schema(self) -> None:
        """Fix the learner's table (and the planners' imagined one) to the columns the algorithm's actors
        insert, so an insert of anything else is refused (with the column, what was sent and what is
        expected) before it is acked or reaches the learner, and both to the values actors' columns may hold
        (common/algorithms/values.py: planners insert the same adder's items, made by stepping the world
        model, so a NaN the model predicts is refused as an env's would be). Without the env here, the first
        insert fixes the columns and no values are checked."""
        names = [self.cfg.learner.table] + ([self.cfg.planning.table] if self.cfg.planning.enabled else [])
        specs = {t.name: t for t in self.cfg.replay.tables}
        tables = [self.server.tables[n] for n in names
                  if n in self.server.tables and n in specs and specs[n].columns == "algorithm"]
        if not tables:
            return
        try:
            columns, values = experience_spec(self.cfg)
        except EnvError as exc:
            log.warning("replay shard %d: tables %s take their columns from their first insert: the env could not "
                        "be made here to learn them (%s)", self.shard, [t.name for t in tables], exc)
            return
        for table in tables:
            try:
                table.declare(columns, values)
            except TableError as exc:
                raise FatalError(f"{exc.detail}: this run directory holds another experiment's data; start with a "
                                 f"new run_dir or the matching config") from None

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def run(self) -> None:
        log.info("replay shard %d: running", self.shard)
        try:
            try:
                self.server.serve()
            finally:
                wal = self.server.wal
                if wal is None or not wal.sync_failed:  # else nothing since the last good fsync may be acked
                    self.server.replies.flush()
                    if self.cfg.replay.durability != "memory":
                        t0 = time.monotonic()
                        self.server.snapshot(wait=True)
                        log.info("replay shard %d: final snapshot of %d items in %.2f s", self.shard,
                                 sum(t.size for t in self.server.tables.values()), time.monotonic() - t0)
        except WalError as exc:  # an fsync failed, while serving or in the last flush (SIGTERM)
            raise FatalError(f"{exc}; the acks (and queue batches) of the inserts and pops since the last "
                             f"good fsync were not sent, their records cut off the log, and no snapshot was "
                             f"written; restart replay: it restores every acked insert from {self.server.dir} "
                             f"and the senders resend the rest") from None

    def stop(self) -> None:
        self.server.stop()

    def health(self) -> dict[str, Any]:
        return {
            "ok": not self.server.stopping,
            "shard": self.shard,
            "tables": {n: t.size for n, t in self.server.tables.items()},
            "held": {"insert": self.server.held.held_inserts(), "sample": self.server.held.held_samples()},
            "durability": self.cfg.replay.durability,
        }

    def close(self) -> None:
        self.server.close()


def build(cfg: Experiment, args: ServiceArgs) -> ReplayService:
    return ReplayService(cfg, args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.replay.main", description="Run one replay shard.")
    p.add_argument("--config", "-c", default=None, help="experiment YAML")
    p.add_argument("--set", dest="sets", action="append", default=[], help="FIELD=VALUE override")
    p.add_argument("--shard", type=int, default=0)
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    setup_logging(a.log_level)
    cfg = load(a.config, a.sets)
    return run_service(cfg, ServiceArgs("replay", shard=a.shard), build)


if __name__ == "__main__":
    raise SystemExit(main())
