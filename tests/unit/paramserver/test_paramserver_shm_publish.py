"""A publisher on the shards' host hands each slice over as a /dev/shm file; others send frames."""

from __future__ import annotations

import fcntl
import glob
import os
from typing import Any

import numpy as np
import pytest

from harness.paramserver_procs import serving
from rlfleet.common import weights_shm as shmlib
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.metrics import ServiceMetrics
from rlfleet.common.tensor_shards import Layout
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.errors import RemoteError
from rlfleet.common.wire.transport import free_tcp_port
from rlfleet.services.paramserver.shard import ShardServer


def model(version: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(version)
    return {"w1": rng.standard_normal((300, 40), dtype=np.float32), "b1": np.full(40, version, np.float32),
            "n": np.full((), version, np.int64)}


def shard_server(**kw: Any) -> ShardServer:
    return ShardServer(ServiceMetrics("paramserver", 0), f"tcp://127.0.0.1:{free_tcp_port()}", 0, 1, 5.0, **kw)


def pub_files(pub: WeightsPublisher) -> list[str]:
    assert pub.writer is not None
    return sorted(glob.glob(pub.writer.base + "*"))


def spare_files(pub: WeightsPublisher) -> list[str]:
    assert pub.writer is not None
    return sorted(path for path, _ in pub.writer.spares.values())


def same(got: dict[str, np.ndarray], version: int) -> bool:
    want = model(version)
    return got.keys() == want.keys() and all(np.array_equal(got[n], w) for n, w in want.items())


def errors(server: ShardServer, reason: str) -> float:
    value = server.metrics.registry.get_sample_value(
        "rlfleet_protocol_errors_total", {"service": "paramserver", "shard": "0", "reason": reason})
    return value or 0.0


def test_the_shard_takes_the_file_over_and_serves_it_to_both_kinds_of_reader() -> None:
    with serving(shard_server()) as server:
        exporter = server.shm.exporter
        assert exporter is not None
        pub = WeightsPublisher([server.endpoint])
        via_shm = WeightsReader([server.endpoint], "shm-reader")
        via_frames = WeightsReader([server.endpoint], "frame-reader", shm=False)
        for version in (1, 2, 3):
            pub.publish(version, model(version))
            assert pub.use_shm == [True]
            # The publisher's file became the shard's version file: only the next spare is left.
            assert pub_files(pub) == spare_files(pub)
            path = exporter.files[version][0]
            assert path.startswith(exporter.base) and os.path.exists(path)
            v1, a = via_shm.wait(version, 10.0)
            v2, b = via_frames.wait(version, 10.0)
            assert v1 == v2 == version and same(a, version) and same(b, version)
            assert all(not arr.flags.writeable for arr in a.values())
        assert sorted(exporter.files) == [2, 3]  # the file of version 1 went with the version
        # A retry of the newest version is acked and its new file removed; other contents are refused.
        pub.publish(3, model(3))
        assert pub_files(pub) == spare_files(pub)
        with pytest.raises(RemoteError) as refused:
            pub.publish(3, model(4))
        assert refused.value.reason == "stale_version"
        assert pub_files(pub) == spare_files(pub)
        assert via_frames.get(-1)[0] == 3 and same(via_frames.get(-1)[1], 3)
        for c in (via_shm, via_frames, pub):
            c.close()
        assert not pub_files(pub)


def test_a_shard_without_shared_memory_gets_frames() -> None:
    with serving(shard_server(shm=False)) as server:
        pub = WeightsPublisher([server.endpoint])
        assert pub.use_shm == [True]
        pub.publish(1, model(1))
        assert pub.use_shm == [False]  # answered shm_unavailable once, then frames
        pub.publish(2, model(2))
        reader = WeightsReader([server.endpoint], "reader")
        version, got = reader.get(-1)
        assert version == 2 and same(got, 2)
        assert not pub_files(pub)
        assert errors(server, "shm_unavailable") == 0  # an expected outcome, not a protocol error
        reader.close()
        pub.close()


def test_bad_shared_memory_publishes_get_errors_and_the_shard_keeps_serving() -> None:
    writer = shmlib.ShmWriter()
    try:
        good = writer.write(0, model(1))
        lay = Layout.of(model(1), 1)
        body = {"version": 1, "num_shards": 1, "layout": lay.fingerprint, "tensors": lay.to_wire()}
        link = f"{writer.base}999"
        os.symlink(good["path"], link)
        with serving(shard_server()) as server, Connection(server.endpoint, "mallory") as c:
            cases = [
                ({"path": "/etc/passwd", "arrays": good["arrays"]}, {}, "bad_shm"),
                ({"path": "/dev/shm/rlfleet-ps-1-probe", "arrays": good["arrays"]}, {}, "bad_shm"),
                ({"path": good["path"], "arrays": [["w1", "float32", [300, 40], 3]]}, {}, "bad_shm"),
                ({"path": good["path"], "arrays": "x"}, {}, "bad_shm"),
                (good, model(1), "bad_shm"),  # a file and frames
                ({"path": f"{writer.base}12345", "arrays": good["arrays"]}, {}, "shm_unavailable"),  # not here
                ({"path": link, "arrays": good["arrays"]}, {}, "shm_unavailable"),  # a symlink
            ]
            for desc, frames, reason in cases:
                with pytest.raises(RemoteError) as err:
                    c.request(Message("publish", {**body, "shm": desc}, frames), 5.0)
                assert err.value.reason == reason, desc
            assert os.path.exists(good["path"])  # none of these were taken over
            reply = c.request(Message("publish", {**body, "shm": good}), 5.0)
            assert reply.type == "publish_ack" and not os.path.exists(good["path"])
            reader = WeightsReader([server.endpoint], "reader")
            assert same(reader.get(-1)[1], 1)
            reader.close()
    finally:
        for path in glob.glob(writer.base + "*"):
            os.unlink(path)
        writer.close()


def test_files_of_dropped_versions_are_reused_only_once_no_reader_maps_them() -> None:
    with serving(shard_server()) as server:
        exporter = server.shm.exporter
        assert exporter is not None
        pub = WeightsPublisher([server.endpoint])
        reader = WeightsReader([server.endpoint], "shm-reader")
        kept: dict[int, dict[str, np.ndarray]] = {}  # versions this reader goes on mapping
        inodes: dict[int, int] = {}
        for version in range(1, 13):
            pub.publish(version, model(version))
            got, arrays = reader.wait(version, 10.0)
            assert got == version and same(arrays, version)
            inodes[version] = os.stat(exporter.files[version][0]).st_ino
            if version in (2, 3):
                kept[version] = arrays
            del arrays
        # Those held files were never written again: the reader still sees its versions, ...
        assert all(same(arrays, version) for version, arrays in kept.items())
        # ... while the pages of the versions let go of came back as later versions' files.
        assert len(set(inodes.values())) < len(inodes)
        assert inodes[2] not in [inodes[v] for v in range(4, 13)]
        assert inodes[3] not in [inodes[v] for v in range(4, 13)]
        # A reclaimed name is gone: a reader that looks for an old version's file is told to ask again.
        with pytest.raises(shmlib.ShmGone):
            shmlib.map_arrays({"path": f"{exporter.base}-v5", "probe": exporter.probe, "arrays": []})
        for c in (reader, pub):
            c.close()


def test_a_reader_never_maps_a_file_while_the_shard_reclaims_it() -> None:
    exporter = shmlib.ShmExporter(0)
    try:
        arrays = {"a": np.arange(16, dtype=np.float32)}
        desc = exporter.export(1, arrays)
        held = shmlib.map_arrays(desc)
        exporter.drop(1)
        exporter.reclaim()
        assert exporter.retired == [desc["path"]] and not exporter.free  # mapped: not reused
        assert np.array_equal(held["a"], arrays["a"])
        del held
        exporter.reclaim()
        assert not exporter.retired and len(exporter.free) == 1 and not os.path.exists(desc["path"])
        with pytest.raises(shmlib.ShmGone):
            shmlib.map_arrays(desc)
        # A reader that has locked the file (and is about to map it) keeps it from being reclaimed too.
        desc2 = exporter.export(2, arrays)
        fd = os.open(desc2["path"], os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            exporter.drop(2)
            exporter.reclaim()
            assert exporter.retired == [desc2["path"]] and os.path.exists(desc2["path"])
        finally:
            os.close(fd)
        exporter.reclaim()
        assert not exporter.retired and len(exporter.free) == 1 and not os.path.exists(desc2["path"])
    finally:
        exporter.close()
