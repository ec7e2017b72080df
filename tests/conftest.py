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

from hypothesis import settings  # noqa: E402

from harness import mutation, skips  # noqa: E402 (the repository is on sys.path from here)

if mutation.MUTATING:  # make mutate: a smaller, fixed hypothesis budget (harness/mutation.py)
    settings.load_profile("mutmut")

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
    from harness.docker_fleet import client_or_reason, ensure_images

    client, reason = client_or_reason()
    if client is None:
        skips.missing("docker", f"Docker is unavailable here: {reason}")
    ensure_images(client)
    return client


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """One line per group of skipped tests: how many, why, and (for a missing dependency, see
    harness/skips.py) the command that installs it. Under CI=true those fail instead."""
    groups: dict[str, list[Any]] = {}  # group (or the skip's own reason) -> [count, reason]
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        message = str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
        message = " ".join(message.removeprefix("Skipped: ").split())
        parsed = skips.parse(message)
        key, reason = parsed if parsed is not None else (message, message)
        groups.setdefault(key, [0, reason])[0] += 1
    if not groups:
        return
    terminalreporter.section("skipped tests, and what would run them")
    for key, (count, reason) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        if key in skips.INSTALL:
            terminalreporter.write_line(f"{count} skipped, they need {key}: {reason}; install: {skips.INSTALL[key]}")
        else:
            terminalreporter.write_line(f"{count} skipped: {reason}")
