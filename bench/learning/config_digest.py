"""What a benchmark run ran, as a short digest: the config's settings as loaded (its comments aside) that
differ from their defaults, and the ``--set`` overrides given with it. A report compares a run's digest with
the config's as it is now, to tell a figure of the current config from one of an older config."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path


def settings_digest(config: Path | str, sets: Sequence[str] = ()) -> str:
    """12 hex digits: a new field whose default keeps the old behaviour leaves the digest as it was."""
    from rlfleet.common import config as config_mod

    settings = config_mod.load(config, environ={}).model_dump_json(exclude_defaults=True)
    return hashlib.sha256((settings + "\0" + "\0".join(sets)).encode()).hexdigest()[:12]
