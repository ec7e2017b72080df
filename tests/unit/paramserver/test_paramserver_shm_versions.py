"""ShmVersions alone: version files written on demand, retired with their version, failures
answered with None (frames) and warned about once per spell."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from rlfleet.services.paramserver.shm_versions import ShmVersions
from rlfleet.services.paramserver.weights_store import Held


def held(version: int) -> Held:
    return Held(version, {"w": np.full((64, 64), version, np.float32)}, "layout")


def test_off_means_frames() -> None:
    shm = ShmVersions("ps-test", 0, enabled=False)
    assert not shm.enabled and shm.export(held(1)) is None and shm.take_free() is None
    shm.retire([1])
    shm.tick(0.0)
    shm.close()


def test_a_version_is_written_once_and_its_file_retired_with_it(tmp_path: Path) -> None:
    shm = ShmVersions("ps-test", 0, enabled=True, directory=str(tmp_path))
    try:
        assert shm.enabled and shm.exporter is not None
        desc = shm.export(held(1))
        assert desc is not None and os.path.exists(desc["path"])
        assert shm.export(held(1)) == desc  # the file is written once, then named again
        shm.retire([1])
        assert 1 not in shm.exporter.files
    finally:
        shm.close()


def test_failures_give_frames_and_one_warning_until_it_works_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "shm"
    directory.mkdir()
    shm = ShmVersions("ps-test", 0, enabled=True, directory=str(directory))
    try:
        shutil.rmtree(directory)  # every write now fails, as on a full /dev/shm
        assert shm.export(held(1)) is None
        assert shm.export(held(1)) is None  # not retried for the same version
        assert shm.export(held(2)) is None
        shm.tick(1.0)
        warnings = [r for r in caplog.records if "readers get frames" in r.getMessage()]
        assert len(warnings) == 1
        directory.mkdir()
        assert shm.export(held(3)) is not None
        assert any("works again" in r.getMessage() for r in caplog.records)
    finally:
        shm.close()
