from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYTHONPATH", str(ROOT))


@pytest.fixture(scope="session")
def docker_client() -> Any:
    """A Docker engine client with the images built (tests/docker_fleet.py). In CI (CI=true) an
    unusable engine fails the run; elsewhere the tests that need it skip with the reason."""
    from tests.docker_fleet import client_or_reason, ensure_images, in_ci

    client, reason = client_or_reason()
    if client is None:
        if in_ci():
            pytest.fail(f"CI=true but Docker is unusable: {reason}. .ci/run installs and starts it.")
        pytest.skip(f"Docker is unavailable here: {reason}")
    ensure_images(client)
    return client
