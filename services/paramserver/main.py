"""Entry point of one parameter-server shard.

    python -m services.paramserver.main [CONFIG.yaml] [--shard N] [--set field=value ...]

``build(cfg, args)`` follows common/runtime.py's contract; the ``rlfleet
service paramserver`` command wraps the same thing.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import zmq

from rlfleet.common.config import ConfigError, Experiment, load
from rlfleet.common.exposure import refuse_plain_exposure
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.runtime import ServiceArgs, run_service, setup_logging
from rlfleet.common.security import server_curve
from rlfleet.common.wire.transport import CurveConfig
from rlfleet.services.paramserver.shard import ShardServer
from rlfleet.services.paramserver.step_counts import FILE as STEP_COUNTS_FILE


class ParamServerService:
    """One shard's server loop plus its health and metrics."""

    def __init__(
        self,
        cfg: Experiment,
        args: ServiceArgs,
        *,
        ctx: zmq.Context[Any] | None = None,
        curve: CurveConfig | None = None,
    ) -> None:
        shards = cfg.paramserver.shards
        if not 0 <= args.shard < shards:
            raise ConfigError(f"paramserver shard {args.shard}: allowed: 0..{shards - 1} (paramserver.shards={shards})")
        self.shard = args.shard
        curve = curve if curve is not None else server_curve(cfg)
        bind = cfg.bind_address("paramserver", args.shard)
        refuse_plain_exposure(cfg, f"paramserver shard {args.shard}", bind, curve is not None)
        self.metrics = ServiceMetrics("paramserver", args.shard)
        self.server = ShardServer(
            self.metrics,
            bind,
            args.shard,
            shards,
            cfg.paramserver.liveness_timeout_s,
            ctx=ctx,
            curve=curve,
            limits=cfg.limits,
            gradients=cfg.paramserver.gradients,
            max_gradient_norm=cfg.paramserver.max_gradient_norm,
            max_members=cfg.paramserver.max_members,
            checkpoint=checkpoint_path(cfg, args.shard),
            experiment=cfg.name,
            step_counts=os.path.join(cfg.run_dir, "paramserver", STEP_COUNTS_FILE) if args.shard == 0 else None,
        )

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def run(self) -> None:
        self.server.serve()

    def stop(self) -> None:
        self.server.stop()

    def health(self) -> dict[str, Any]:
        s = self.server
        out: dict[str, Any] = {"ok": not s.stopping, "shard": self.shard, "versions": s.weights.versions,
                               "waits_parked": len(s.long_polls)}
        if s.registry is not None:
            out["live_actors"] = s.registry.num_actors
        return out

    def close(self) -> None:
        self.server.close()


def checkpoint_path(cfg: Experiment, shard: int) -> str:
    """Where shard ``shard`` keeps what gradient pushes made of its slice (written only if it applies any)."""
    return os.path.join(cfg.run_dir, "paramserver", f"shard-{shard}.npz")


def build(cfg: Experiment, args: ServiceArgs) -> ParamServerService:
    return ParamServerService(cfg, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.paramserver.main", description=__doc__)
    parser.add_argument("config", nargs="?", help="experiment YAML file")
    parser.add_argument("--shard", type=int, default=0, help="shard index (0..paramserver.shards-1)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--log-level", default="INFO")
    ns = parser.parse_args(argv)
    setup_logging(ns.log_level)
    try:
        cfg = load(ns.config, ns.sets)
        return run_service(cfg, ServiceArgs("paramserver", shard=ns.shard), build)
    except ConfigError as exc:
        print(f"paramserver: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
