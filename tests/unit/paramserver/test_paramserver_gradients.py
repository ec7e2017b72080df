"""Gradient pushes applied by paramserver shards (real shard processes, real sockets)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from harness.paramserver_procs import ShardProcesses
from rlfleet.common.clients.gradient_pusher import GradientPusher
from rlfleet.common.clients.registry import RegistryClient
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.config.sections import GradientsConfig
from rlfleet.common.tensor_shards import Layout
from rlfleet.common.wire.codec import Message
from rlfleet.common.wire.connection import Connection
from rlfleet.common.wire.errors import CommTimeout
from rlfleet.services.paramserver.shard_optimizer import FlatSlice, ShardOptimizer


def model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((30, 8)).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32),
            "v": rng.standard_normal((8, 2)).astype(np.float32)}


@pytest.mark.parametrize("kind,extra", [("adam", {}), ("rmsprop", {"eps": 1e-5}), ("rmsprop", {"momentum": 0.9}),
                                        ("sgd", {"momentum": 0.9}), ("sgd", {}),
                                        ("rmsprop", {"eps": 1e-5, "lr_final": 0.0, "lr_decay_steps": 4}),
                                        ("adam", {"lr_final": 2e-3, "lr_decay_steps": 3})])
def test_shard_optimizer_matches_torch(kind: str, extra: dict[str, Any]) -> None:
    """Each rule, and the linear lr schedule (torch's LambdaLR, stepped after each step), to float32 precision."""
    cfg = GradientsConfig(optimizer=kind, lr=1e-2, **extra)
    params = model(1)
    tparams = {n: torch.nn.Parameter(torch.tensor(a)) for n, a in params.items()}
    if kind == "adam":
        topt: torch.optim.Optimizer = torch.optim.Adam(tparams.values(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    elif kind == "rmsprop":
        topt = torch.optim.RMSprop(tparams.values(), lr=cfg.lr, alpha=cfg.alpha, eps=cfg.eps, momentum=cfg.momentum)
    else:
        topt = torch.optim.SGD(tparams.values(), lr=cfg.lr, momentum=cfg.momentum)
    final = cfg.lr_final if cfg.lr_final is not None else cfg.lr
    schedule = torch.optim.lr_scheduler.LambdaLR(
        topt, lambda k: 1 + (final / cfg.lr - 1) * min(1.0, k / cfg.lr_decay_steps))
    flat = FlatSlice(params)
    p_flat = flat.pack(params)
    opt = ShardOptimizer(cfg, flat.size)
    rng = np.random.default_rng(2)
    for _ in range(6):
        grads = {n: rng.standard_normal(a.shape).astype(np.float32) for n, a in params.items()}
        opt.step(p_flat, flat.pack(grads))
        for n, p in tparams.items():
            p.grad = torch.tensor(grads[n])
        topt.step()
        schedule.step()
    ours = flat.views(p_flat)
    for n, p in tparams.items():
        np.testing.assert_allclose(ours[n], p.detach().numpy(), rtol=1e-5, atol=1e-6)
    if cfg.lr_final is not None:  # the schedule took effect: the last steps ran at lr_final
        assert cfg.lr_at(6) == pytest.approx(cfg.lr_final)


def push_raw(address: str, layout: Layout, shard: int, version: int, arrays: dict[str, Any], sender: str = "w",
             seq: int | None = None) -> Message:
    body = {"version": version, "num_shards": layout.num_shards, "layout": layout.fingerprint}
    with Connection(address, sender) as c:
        sent = c.send(Message("push_gradients", body, arrays), seq=seq)
        deadline = time.monotonic() + 5.0
        while (reply := c.reply_to(sent)) is None:
            assert time.monotonic() < deadline and c.wait(deadline - time.monotonic()), "no reply"
        return reply


@pytest.fixture
def shards(tmp_path: Path) -> Any:
    sets = [f"run_dir={tmp_path}", "paramserver.gradients.optimizer=sgd", "paramserver.gradients.lr=0.5",
            "paramserver.gradients.max_staleness=2", "paramserver.gradients.checkpoint_every_s=0.2"]
    with ShardProcesses(2, extra_sets=sets) as ps:
        ps.wait_ready()
        yield ps


def test_pushes_make_versions_readers_see_and_stale_ones_are_refused(shards: ShardProcesses) -> None:
    addrs = shards.addresses
    w0 = model()
    grads = {n: np.ones_like(a) for n, a in w0.items()}
    pusher = GradientPusher(addrs, "worker-a/1")
    refused = pusher.push(0, grads)
    assert {r for r, _ in refused.refused.values()} == {"no_weights"}  # nothing published yet
    WeightsPublisher(addrs).publish(0, w0)
    reader = WeightsReader(addrs, "reader")
    out = pusher.push(0, grads)
    assert out.complete and out.applied == 2 and out.version == 1 and out.staleness == 0
    version, weights = reader.get(-1)
    assert version == 1
    for n in w0:  # sgd, lr 0.5: every weight moved by -0.5 on both shards
        np.testing.assert_allclose(weights[n], w0[n] - 0.5, rtol=1e-6)
    for _ in range(2):
        assert pusher.push(0, grads).complete  # staleness 1 and 2: allowed
    stale = pusher.push(0, grads)  # computed on version 0, the newest is 3
    assert set(stale.refused) == {0, 1} and {r for r, _ in stale.refused.values()} == {"stale_gradients"}
    assert "at most 2" in stale.refused[0][1]
    assert reader.get(-1)[0] == 3  # the refused push changed nothing
    future = pusher.push(9, grads)
    assert {r for r, _ in future.refused.values()} == {"unknown_version"}
    pusher.close()
    reader.close()


def test_bad_gradients_are_refused_whole_and_counted(shards: ShardProcesses) -> None:
    addrs = shards.addresses
    w0 = model()
    WeightsPublisher(addrs).publish(0, w0)
    layout = Layout.of(w0, 2)
    good = {n: np.ones_like(a) for n, a in w0.items()}
    s0 = layout.slice(good, 0)
    name = sorted(s0)[0]
    cases = {
        "NaN": {**s0, name: np.full_like(s0[name], np.nan)},
        "dtype": {**s0, name: s0[name].astype(np.float64)},
        "shape": {**s0, name: np.ones((3,), np.float32)},
        "missing": {k: v for k, v in s0.items() if k != name},
        "extra": {**s0, "nope": np.ones(2, np.float32)},
    }
    for what, arrays in cases.items():
        r = push_raw(addrs[0], layout, 0, 0, arrays)
        assert r.type == "error" and r["reason"] == "bad_gradients", (what, r)
    other = Layout.of({"z": np.ones(3, np.float32)}, 2)
    r = push_raw(addrs[0], other, 0, 0, {"z": np.ones(3, np.float32)})
    assert r["reason"] == "layout_mismatch" and other.fingerprint in r["detail"]
    with Connection(addrs[0], "probe") as c:
        stats = c.request(Message("info"), 5.0)["stats"]
    assert stats["versions"] == [0]  # nothing applied in part
    # the shard still applies a good push
    assert push_raw(addrs[0], layout, 0, 0, s0)["applied"] is True


def test_a_resent_push_is_applied_once(shards: ShardProcesses) -> None:
    addrs = shards.addresses
    w0 = model()
    WeightsPublisher(addrs).publish(0, w0)
    layout = Layout.of(w0, 2)
    s1 = layout.slice({n: np.ones_like(a) for n, a in w0.items()}, 1)
    first = push_raw(addrs[1], layout, 1, 0, s1, sender="worker-b/2", seq=7)
    again = push_raw(addrs[1], layout, 1, 0, s1, sender="worker-b/2", seq=7)
    assert first["applied"] is True and first["version"] == 1
    assert again["duplicate"] is True and again["applied"] is False and again["version"] == 1
    other = push_raw(addrs[1], layout, 1, 0, s1, sender="worker-c/3", seq=7)  # another sender: its own push
    assert other["applied"] is True and other["version"] == 2
    far = push_raw(addrs[1], layout, 1, 1, s1, sender="worker-b/2", seq=7 + 100_000)
    assert far["reason"] == "seq_out_of_window"


def test_a_restarted_shard_goes_on_from_its_checkpoint(shards: ShardProcesses, tmp_path: Path) -> None:
    addrs = shards.addresses
    w0 = model()
    WeightsPublisher(addrs).publish(0, w0)
    pusher = GradientPusher(addrs, "worker-d/4")
    grads = {n: np.ones_like(a) for n, a in w0.items()}
    for v in range(3):
        assert pusher.push(v, grads).complete
    shards.procs[0].send_signal(signal.SIGTERM)  # a clean stop writes the checkpoint
    shards.procs[0].wait(20)
    assert (tmp_path / "paramserver" / "shard-0.npz").exists()
    shards.restart(0)
    reader = WeightsReader(addrs, "reader")
    version, weights = reader.get(-1)
    assert version == 3
    for n in w0:
        np.testing.assert_allclose(weights[n], w0[n] - 1.5, rtol=1e-6)
    assert pusher.push(3, grads).version == 4  # goes on counting on both shards
    deadline = time.monotonic() + 10
    while (v := reader.get(-1)) is None or v[0] != 4:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    np.testing.assert_allclose(v[1]["w"], w0["w"] - 2.0, rtol=1e-6)
    pusher.close()
    reader.close()


def test_a_barrier_round_applies_the_mean_once_every_live_worker_pushed(tmp_path: Path) -> None:
    sets = [f"run_dir={tmp_path}", "paramserver.gradients.optimizer=sgd", "paramserver.gradients.lr=1.0",
            "paramserver.liveness_timeout_s=3.0"]
    with ShardProcesses(1, extra_sets=sets) as shards:
        addr = shards.addresses
        w0 = model()
        WeightsPublisher(addr).publish(0, w0)
        workers = {name: RegistryClient(addr[0], name, "actor") for name in ("worker-0", "worker-1", "worker-2")}
        for reg in workers.values():
            reg.hello(timeout_s=5.0)
        pushers = {name: GradientPusher(addr, f"{name}/tok", timeout_s=0.5) for name in workers}
        grads = {name: {n: np.full_like(a, i + 1) for n, a in w0.items()} for i, name in enumerate(workers)}
        # two of three pushed: the round waits (the pushes are held, unanswered)
        for name in ("worker-0", "worker-1"):
            with pytest.raises(CommTimeout):
                pushers[name].push(0, grads[name], barrier=True)
        for reg in workers.values():
            reg.heartbeat(0, timeout_s=2.0)
        # the third push completes it: every held push is answered, the mean (2.0) applied once
        out = pushers["worker-2"].push(0, grads["worker-2"], barrier=True)
        assert out.complete and out.version == 1
        for name in ("worker-0", "worker-1"):  # their pushes again (same seqs): the late ack, or a duplicate's
            again = pushers[name].push(0, grads[name], barrier=True, again=True)
            assert again.applied + again.duplicates == 1 and again.version == 1
        reader = WeightsReader(addr, "reader")
        version, weights = reader.get(-1)
        assert version == 1
        np.testing.assert_allclose(weights["w"], w0["w"] - 2.0, rtol=1e-6)
        # a push for the round that is over is stale
        late = pushers["worker-0"].push(0, grads["worker-0"], barrier=True)
        assert {r for r, _ in late.refused.values()} == {"stale_gradients"}
        # a worker that stops heartbeating leaves the registry: the round completes without it
        with pytest.raises(CommTimeout):
            pushers["worker-0"].push(1, grads["worker-0"], barrier=True)
        deadline, again = time.monotonic() + 10, False
        while True:  # as a worker waits for its round: heartbeats, and the same push again
            for name in ("worker-0", "worker-1"):
                workers[name].heartbeat(1, timeout_s=2.0)
            try:
                out = pushers["worker-1"].push(1, grads["worker-1"], barrier=True, again=again)
                break
            except CommTimeout:
                again = True
                assert time.monotonic() < deadline, "the round never completed without worker-2"
        assert out.version == 2
        np.testing.assert_allclose(reader.get(-1)[1]["w"], w0["w"] - 2.0 - 1.5, rtol=1e-6)
        for p in pushers.values():
            p.close()
        for reg in workers.values():
            reg.close()
        reader.close()


def test_a_packed_push_is_the_flat_gradient_and_its_padding_is_not_trusted() -> None:
    """A packed push in the slice's name order is used as the flat gradient without a copy; NaNs a
    client put in the padding between tensors are not applied."""
    from rlfleet.common.wire.codec import encode
    from rlfleet.common.wire.decoder import decode
    from rlfleet.services.paramserver.gradients import SliceTrainer

    w = {"a": np.ones(3, np.float32), "b": np.ones((2, 1), np.float32)}  # "a" ends mid-8-bytes: padded
    trainer = SliceTrainer(GradientsConfig(optimizer="sgd", lr=1.0))
    trainer.follow(0, w)
    frames = encode(Message("push_gradients", {"version": 0, "num_shards": 1, "layout": "x"},
                            {"a": np.full(3, 2, np.float32), "b": np.full((2, 1), 3, np.float32)}, "w", 1), packed=True)
    msg = decode(frames)
    assert trainer.flat is not None and trainer.flat.payload(msg.arrays, msg.layout) is not None
    payload = bytearray(frames[1])
    payload[12:16] = np.float32(np.nan).tobytes()  # the 4 padding bytes after "a"
    msg = decode([frames[0], bytes(payload)])
    new = trainer.apply(msg.arrays, msg.layout)
    np.testing.assert_array_equal(new["a"], [-1, -1, -1])
    np.testing.assert_array_equal(new["b"], [[-2], [-2]])
    assert np.isfinite(trainer.params).all()


def wait_for_checkpoint(path: Path, version: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with np.load(path, allow_pickle=False) as z:
                if json.loads(z["meta"].tobytes())["version"] == version:
                    return
        except (OSError, KeyError, ValueError):
            pass  # not written yet, or being replaced
        assert time.monotonic() < deadline, f"{path} never held version {version}"
        time.sleep(0.05)


def test_a_shard_that_dies_halfway_through_a_push_gets_it_again_and_the_shards_agree(tmp_path: Path) -> None:
    """Two shards; shard 1 is killed -9 (after a checkpoint) and a push reaches only shard 0; the same push
    sent again once shard 1 is back: shard 0 answers it as a duplicate, shard 1 applies it, and readers
    see one consistent version again."""
    sets = [f"run_dir={tmp_path}", "paramserver.gradients.optimizer=sgd", "paramserver.gradients.lr=1.0",
            "paramserver.gradients.checkpoint_every_s=0.2"]
    with ShardProcesses(2, extra_sets=sets) as shards:
        addr = shards.addresses
        w0 = model()
        WeightsPublisher(addr).publish(0, w0)
        grads = {n: np.ones_like(a) for n, a in w0.items()}
        pusher = GradientPusher(addr, "worker-h/1", timeout_s=1.0)
        for v in range(2):
            assert pusher.push(v, grads).complete
        wait_for_checkpoint(tmp_path / "paramserver" / "shard-1.npz", 2)
        shards.procs[1].kill()
        shards.procs[1].wait(10)
        with pytest.raises(CommTimeout):  # shard 0 applies it (version 3), shard 1 is gone
            pusher.push(2, grads)
        shards.restart(1)  # back from its checkpoint: version 2
        out = pusher.push(2, grads, again=True)  # the same push, the same seqs
        assert out.complete and out.applied + out.duplicates == 2 and out.version == 3
        reader = WeightsReader(addr, "reader")
        version, weights = reader.get(-1)
        assert version == 3
        for n in w0:  # three pushes applied once each on both shards
            np.testing.assert_allclose(weights[n], w0[n] - 3.0, rtol=1e-6)
        pusher.close()
        reader.close()


def test_a_refused_resend_leaves_a_held_round_contribution_as_it_was() -> None:
    """Barrier: a sender's push held in the round, then a push of the same sender with a NaN: refused,
    and the round's mean is still the first push's."""
    from rlfleet.common.wire.server import Peer
    from rlfleet.services.paramserver.gradients import GradientApplier, Refusal

    w = {"a": np.zeros(3, np.float32)}
    layout = Layout.of(w, 1)
    applier = GradientApplier(GradientsConfig(optimizer="sgd", lr=1.0), None, 0)

    def push(seq: int, value: float) -> Message:
        return Message("push_gradients", {"version": 0, "num_shards": 1, "layout": layout.fingerprint,
                                          "barrier": True}, {"a": np.full(3, value, np.float32)}, sender="w/1", seq=seq)

    assert applier.push(push(1, 2.0), layout, [0], w, Peer(b"x", 1)) == (None, None)
    with pytest.raises(Refusal, match="NaN"):
        applier.push(push(2, np.nan), layout, [0], w, Peer(b"x", 2))
    done = applier.complete({"w"})
    assert done is not None
    np.testing.assert_array_equal(done[1]["a"], [-2.0, -2.0, -2.0])
