"""What every test shares: the repository on sys.path, markers by folder, the Docker engine fixture.

The suite mirrors the rooms (docs/testing.md): tests/unit/<room>/ (one room of the code, real sockets
and fakes, no whole fleet), tests/fleet/ (whole fleets: marker ``e2e``), tests/chaos/ (kills,
partitions, hostile input: ``chaos``), tests/containers/ (Docker: ``container``). The folder sets
the marker; a unit file's one fleet-level test carries its own. Helpers live in harness/.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYTHONPATH", str(ROOT))

FOLDER_MARKERS = {"fleet": "e2e", "chaos": "chaos", "containers": "container"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).relative_to(ROOT / "tests").parts[0]
        if folder in FOLDER_MARKERS:
            item.add_marker(FOLDER_MARKERS[folder])


@pytest.fixture(scope="session")
def docker_client() -> Any:
    """A Docker engine client with the images built (harness/docker_fleet.py). In CI (CI=true) an
    unusable engine fails the run; elsewhere the tests that need it skip with the reason."""
    from harness.docker_fleet import client_or_reason, ensure_images, in_ci

    client, reason = client_or_reason()
    if client is None:
        if in_ci():
            pytest.fail(f"CI=true but Docker is unusable: {reason}. .ci/run installs and starts it.")
        pytest.skip(f"Docker is unavailable here: {reason}")
    ensure_images(client)
    return client
