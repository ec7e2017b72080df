"""Algorithms: one contract (:mod:`.contract`), one registry (:mod:`.registry`), one folder each.

An algorithm is a folder ``common/algorithms/<name>/`` with its config, networks,
loss, policy (acting) and learner, and a Builder (``builder.py``) that names them.
Services only go through :func:`get` (the Builder) and the contract, so adding an
algorithm is that folder and one line of the registry: the experiment's
``algorithm:`` section is built from the folders' config classes.

Nothing here opens sockets or imports torch at import time.
"""

from __future__ import annotations

# First, before any algorithm folder: an algorithm's config imports common.config.sections,
# and common.config builds its algorithm union from this package; loading common.config
# first lets that finish before any algorithm folder is half-imported.
import rlfleet.common.config  # noqa: F401
from rlfleet.common.algorithms.builder import Builder
from rlfleet.common.algorithms.contract import (
    Adder,
    Columns,
    ColumnSchema,
    DataSpec,
    EnvMismatch,
    Grads,
    Learner,
    Policy,
    UnknownAlgorithm,
    drop_stale,
)
from rlfleet.common.algorithms.registry import available, check_env, config_classes, get, register

__all__ = [
    "Adder",
    "Builder",
    "ColumnSchema",
    "Columns",
    "DataSpec",
    "EnvMismatch",
    "Grads",
    "Learner",
    "Policy",
    "UnknownAlgorithm",
    "available",
    "check_env",
    "config_classes",
    "drop_stale",
    "get",
    "register",
]
