"""`rlfleet up --init-from CHECKPOINT`: a new run that starts from another run's weights (weights only).

The checkpoint's acting weights (any file `rlfleet eval` reads: a learner's checkpoint, an evaluator's
best.pt, a paramserver shard's .npz) are published to the new fleet's paramserver as version 0 once the
paramserver answers and before the learner or any worker starts. The learner, having no checkpoint of
its own, then starts from the fleet's weights (its optimizer, targets and counters fresh), and gradient
workers take version 0 as their first weights, as for any fleet whose paramserver already holds weights.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from rlfleet.common.config import Experiment
from rlfleet.common.security import client_curve

INIT_VERSION = 0


def read_weights(checkpoint: str | Path, cfg: Experiment) -> dict[str, np.ndarray]:
    """The acting weights of ``checkpoint``; CheckpointError names the file when it cannot serve ``cfg``'s
    networks (another algorithm, or tensors of other names or shapes)."""
    from rlfleet.cli.evaluate import CheckpointError, load_any
    from rlfleet.common.envs import acting_policy

    loaded = load_any(checkpoint)
    try:
        acting_policy(cfg).load_weights(loaded.weights)  # every name and shape checked, as an actor would
    except ValueError as exc:
        raise CheckpointError(f"--init-from {checkpoint}: its weights ({loaded.cfg.algorithm.name} on "
                              f"{loaded.cfg.env.id}) do not fit this experiment's networks ({cfg.algorithm.name} "
                              f"on {cfg.env.id}): {exc}") from None
    return dict(loaded.weights)


def publish_initial(cfg: Experiment, weights: Mapping[str, np.ndarray], timeout_s: float) -> None:
    """Publish ``weights`` as version 0 to every paramserver shard of ``cfg`` (retried until ``timeout_s``)."""
    from rlfleet.common.clients.weights_publisher import WeightsPublisher
    from rlfleet.common.wire.errors import CommTimeout

    deadline = time.monotonic() + timeout_s
    publisher = WeightsPublisher(cfg.network.paramserver, "launcher-init", curve=client_curve(cfg, "learner"))
    try:
        while True:
            try:
                publisher.publish(INIT_VERSION, weights, timeout_s=min(cfg.network.timeout_s, timeout_s))
                return
            except CommTimeout:
                if time.monotonic() > deadline:
                    raise
    finally:
        publisher.close()
