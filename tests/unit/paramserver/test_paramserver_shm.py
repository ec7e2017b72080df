"""Same-host readers map weights from /dev/shm; others (or a failed mapping) get frames."""

from __future__ import annotations

import glob
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness import skips
from harness.paramserver_procs import ShardProcesses, serving
from rlfleet.common import weights_shm as shmlib
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.paramserver.shard import ShardServer


def model(version: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(version)
    return {"w1": rng.standard_normal((300, 40), dtype=np.float32), "b1": np.full(40, version, np.float32),
            "w2": rng.standard_normal((40, 300), dtype=np.float32), "n": np.full((), version, np.int64)}


def files_of(pid: int) -> list[str]:
    return glob.glob(f"/dev/shm/{shmlib.PREFIX}{pid}-*")


def served_files(pid: int) -> list[str]:
    """What the shard's files are named after (spare and reclaimed free files left out)."""
    return sorted(f.rsplit("-", 1)[1] for f in files_of(pid) if "spare" not in f and "free" not in f)


def is_mapped(arr: np.ndarray) -> bool:
    base = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return type(base).__name__ == "mmap"


def test_shm_and_frames_agree_and_fallback_works() -> None:
    assert shmlib.available()
    with ShardProcesses(2) as ps:
        pids = [p.pid for p in ps.procs]
        pub = WeightsPublisher(ps.addresses)
        via_shm = WeightsReader(ps.addresses, "shm-reader")
        via_frames = WeightsReader(ps.addresses, "frame-reader", shm=False)
        pub.publish(1, model(1))
        v1, a = via_shm.wait(1, 10.0)
        v2, b = via_frames.get(-1)
        assert v1 == v2 == 1 and a.keys() == b.keys() == model(1).keys()
        for name, want in model(1).items():
            assert np.array_equal(a[name], want) and np.array_equal(b[name], want)
            assert not a[name].flags.writeable
        assert all(is_mapped(arr) for arr in a.values() if arr.size)
        assert not any(is_mapped(arr) for arr in b.values())
        # A reply naming files this reader cannot see (another host's /dev/shm): frames from then on.
        ghost = Message("weights", {"version": 2, "versions": [2], "layout": "x", "shm": {
            "path": "/dev/shm/rlfleet-ps-ghost-v2", "probe": "/dev/shm/rlfleet-ps-ghost-probe", "arrays": []}})
        assert via_shm._map_shm({1: ghost}) == ({}, False)
        assert via_shm.use_shm == [True, False]
        pub.publish(2, model(2))
        version, c = via_shm.get(1)
        assert version == 2 and all(np.array_equal(c[n], w) for n, w in model(2).items())
        assert is_mapped(c["w1"] if "w1" in pub.layout.shards[0] else c["w2"])
        assert not is_mapped(c["w2"] if "w1" in pub.layout.shards[0] else c["w1"])
        # A shard keeps files for its two newest versions only.
        pub.publish(3, model(3))
        assert via_shm.wait(3, 10.0)[0] == 3
        pub.publish(4, model(4))
        assert via_shm.wait(4, 10.0)[0] == 4
        # Shard 0 serves files for its two newest versions; the files of versions 1 and 2 stay as they
        # were while this reader maps them (a and c), and are reused once it lets go.
        assert served_files(pids[0]) == ["probe", "v1", "v2", "v3", "v4"]
        mine = "w1" if "w1" in pub.layout.shards[0] else "w2"  # a tensor of shard 0's slice
        assert np.array_equal(a[mine], model(1)[mine]) and np.array_equal(c[mine], model(2)[mine])
        del a, c
        pub.publish(5, model(5))
        assert via_shm.wait(5, 10.0)[0] == 5
        assert served_files(pids[0]) == ["probe", "v4", "v5"]
        for r in (via_shm, via_frames, pub):
            r.close()
    assert not files_of(pids[0]) and not files_of(pids[1])  # removed on a clean stop


def test_gone_versus_unavailable() -> None:
    probe = "/dev/shm/rlfleet-ps-test-probe"
    open(probe, "wb").close()
    try:
        with pytest.raises(shmlib.ShmGone):
            shmlib.map_arrays({"path": "/dev/shm/rlfleet-ps-test-v9", "probe": probe, "arrays": []})
    finally:
        os.unlink(probe)
    with pytest.raises(shmlib.ShmUnavailable):
        shmlib.map_arrays({"path": "/dev/shm/rlfleet-ps-test-v9", "probe": probe, "arrays": []})


@pytest.mark.parametrize("desc", [
    {"path": "/etc/passwd", "probe": "/dev/shm/rlfleet-ps-x", "arrays": []},
    {"path": "/dev/shm/rlfleet-ps-../../etc/passwd", "probe": "/dev/shm/rlfleet-ps-x", "arrays": []},
    {"path": "/dev/shm/rlfleet-ps-test", "probe": "/dev/shm/rlfleet-ps-test", "arrays": [["a", "float32", [4], 64]]},
    {"path": "/dev/shm/rlfleet-ps-test", "probe": "/dev/shm/rlfleet-ps-test", "arrays": [["a", "object", [1], 0]]},
    {"path": "/dev/shm/rlfleet-ps-test", "probe": "/dev/shm/rlfleet-ps-test", "arrays": [["a", "float32", [1], 3]]},
    "not a map",
])
def test_map_arrays_trusts_nothing(desc: object) -> None:
    path = "/dev/shm/rlfleet-ps-test"
    with open(path, "wb") as f:
        f.write(b"\0" * 64)
    try:
        with pytest.raises(ValueError):
            shmlib.map_arrays(desc)
    finally:
        os.unlink(path)


def shard_server(**kw: Any) -> ShardServer:
    return ShardServer(ServiceMetrics("paramserver", 0), f"tcp://127.0.0.1:{free_tcp_port()}", 0, 1, 5.0, **kw)


def parked(address: str) -> int:
    with Connection(address, "probe") as c:
        return int(c.request(Message("info"), 5.0)["stats"]["waits_parked"])


def test_a_failing_shm_write_serves_frames_to_parked_and_later_readers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    server = shard_server(shm_dir=str(shm_dir))
    assert server.shm.enabled
    shutil.rmtree(shm_dir)  # from now on every shared-memory write fails with an OSError, as on a full /dev/shm
    with serving(server):
        addr = server.endpoint
        pub = WeightsPublisher([addr])
        reader = WeightsReader([addr], "reader")
        assert reader.use_shm == [True]
        with Connection(addr, "parked-reader") as c:
            seq = c.send(Message("wait", {"min_version": 1, "timeout_ms": 60_000, "shm": True}))
            deadline = time.monotonic() + 15
            while parked(addr) < 1:
                assert time.monotonic() < deadline, "the wait was never parked"
            pub.publish(1, model(1))  # wakes the parked wait: its export fails
            reply = c.recv(10.0)
        assert (reply.type, reply["ref_seq"], reply.get("shm")) == ("weights", seq, None)
        assert all(np.array_equal(reply.arrays[n], w) for n, w in model(1).items())
        for _ in range(2):  # later requests of the same version, and of the next one
            version, got = reader.wait(reader.version + 1, 10.0)
            assert all(np.array_equal(got[n], w) for n, w in model(version).items())
            assert not any(is_mapped(a) for a in got.values())
            pub.publish(version + 1, model(version + 1))
        assert reader.get(-1)[0] == 3
        warnings = [r for r in caplog.records if "readers get frames" in r.getMessage()]
        assert len(warnings) == 1  # three versions failed (and spare files too): logged once
        assert not server.metrics.registry.get_sample_value(
            "rlfleet_protocol_errors_total", {"service": "paramserver", "shard": "0", "reason": "internal"})
        reader.close()
        pub.close()


class BrokenExporter(shmlib.ShmExporter):
    """Shared memory that fails with an unexpected error (answered ``internal``)."""

    def export(self, version: int, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        raise RuntimeError("shared memory is broken on this shard")


def test_reader_falls_back_to_frames_when_a_shm_request_fails() -> None:
    broken = shard_server()
    broken.shm.close()
    broken.shm.exporter = BrokenExporter(0)
    with serving(broken) as server:
        addr = server.endpoint
        pub = WeightsPublisher([addr])
        pub.publish(1, model(1))
        for ask in ("get", "wait"):
            reader = WeightsReader([addr], f"{ask}-reader")
            assert reader.use_shm == [True]
            version, got = reader.get(-1) if ask == "get" else reader.wait(1, 10.0)
            assert version == 1 and all(np.array_equal(got[n], w) for n, w in model(1).items())
            assert reader.use_shm == [False]
            reader.close()
        pub.close()


def test_map_arrays_refuses_symlinks_and_files_not_ours() -> None:
    target = "/dev/shm/rlfleet-ps-test-target"
    link, fifo, directory = (f"/dev/shm/rlfleet-ps-test-{n}" for n in ("link", "fifo", "dir"))
    arrays = [["a", "float32", [4], 0]]
    with open(target, "wb") as f:
        f.write(b"\0" * 64)
    os.symlink(target, link)
    os.mkfifo(fifo, 0o600)  # opening a fifo read-only would block without O_NONBLOCK
    os.mkdir(directory)
    cases = [link, fifo, directory]
    try:
        assert shmlib.map_arrays({"path": target, "probe": target, "arrays": arrays})["a"].shape == (4,)
        for path in cases:
            with pytest.raises(shmlib.ShmUnavailable):
                shmlib.map_arrays({"path": path, "probe": target, "arrays": arrays})
        # a missing file whose probe is a symlink to a live probe is not "gone": it is unavailable
        with pytest.raises(shmlib.ShmUnavailable):
            shmlib.map_arrays({"path": "/dev/shm/rlfleet-ps-test-none", "probe": link, "arrays": arrays})
    finally:
        for path in (target, link, fifo):
            if os.path.lexists(path):
                os.unlink(path)
        os.rmdir(directory)


def test_map_arrays_refuses_a_file_another_uid_owns() -> None:
    if os.getuid() != 0:
        skips.missing("root", "only root can make a file owned by another uid")
    target, foreign = "/dev/shm/rlfleet-ps-test-mine", "/dev/shm/rlfleet-ps-test-foreign"
    arrays = [["a", "float32", [4], 0]]
    with open(target, "wb") as f:
        f.write(b"\0" * 64)
    shutil.copy(target, foreign)
    os.chown(foreign, 54321, 54321)
    try:
        assert shmlib.map_arrays({"path": target, "probe": target, "arrays": arrays})["a"].shape == (4,)
        with pytest.raises(shmlib.ShmUnavailable, match="owned by uid"):  # root may open it: the owner check refuses
            shmlib.map_arrays({"path": foreign, "probe": target, "arrays": arrays})
    finally:
        for path in (target, foreign):
            if os.path.lexists(path):
                os.unlink(path)
