"""Skips that speak: a test that needs what this machine lacks says what, why, and how to get it.

A test (or fixture) that needs a Docker engine, network namespaces with nft, a prometheus binary or
root calls :func:`missing` when the need is not met. Under ``CI=true`` that fails the test (CI
provisions everything: ``.ci/run``); elsewhere the test skips with a reason that starts
``[needs <group>]``, and ``tests/conftest.py`` ends the run with one line per group: how many tests
were skipped, why, and the command that installs what they need.
"""

from __future__ import annotations

import os
import re
from typing import NoReturn

import pytest

# group -> the command (or steps) that provides it on a Debian machine like CI's
INSTALL = {
    "docker": "apt-get install docker.io docker-compose debootstrap, start dockerd (as .ci/run does), then "
              "make images",
    "netns": "apt-get install iproute2 nftables, and run the tests as root",
    "prometheus": "apt-get install prometheus",
    "root": "run the tests as root (CI does)",
}
_TAG = re.compile(r"^\[needs (?P<group>[a-z]+)\] (?P<reason>.*)$", re.S)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def missing(group: str, reason: str) -> NoReturn:
    """The calling test needs ``group`` (a key of INSTALL), which is missing here for ``reason``:
    fail under CI=true, skip elsewhere with a reason the end-of-run summary groups."""
    if group not in INSTALL:
        raise ValueError(f"unknown dependency group {group!r}: one of {sorted(INSTALL)}")
    if in_ci():
        pytest.fail(f"CI=true but this test needs {group}: {reason}. To provide it: {INSTALL[group]}")
    pytest.skip(f"[needs {group}] {reason}")


def parse(message: str) -> tuple[str, str] | None:
    """(group, reason) of a skip message made by :func:`missing`, else None."""
    message = message.removeprefix("Skipped: ")
    m = _TAG.match(message)
    return None if m is None else (m["group"], m["reason"])
