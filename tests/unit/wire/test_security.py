"""CurveZMQ across the fleet: `rlfleet keys`, key errors, strangers refused, the metrics bind, curve end to end.

Servers are real processes (`rlfleet service replay|paramserver`); clients are
the fleet's own clients with the keys `rlfleet keys` made, and strangers are a
fresh CurveZMQ key pair, a plain-text ZeroMQ client and a raw TCP writer.
"""

from __future__ import annotations

import socket
import stat
import struct
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
import zmq
import zmq.auth

from harness.fleet_helpers import CONFIGS, only_run_dir, read_csv, rlfleet
from harness.replay_helpers import transitions
from harness.service_procs import ServiceProcess
from rlfleet.common import config, security
from rlfleet.common.clients.replay_insert import InsertClient
from rlfleet.common.clients.replay_sample import SampleClient
from rlfleet.common.clients.weights_publisher import WeightsPublisher
from rlfleet.common.clients.weights_reader import WeightsReader
from rlfleet.common.wire.codec import Message, encode
from rlfleet.common.wire.decoder import decode
from rlfleet.common.wire.transport import CurveConfig, fingerprint, free_tcp_port, make_socket

STRANGER_MESSAGES = 10_000


# -- rlfleet keys ----------------------------------------------------------------------


def test_keys_command_writes_zeromq_certificates_and_refuses_to_overwrite(tmp_path: Path) -> None:
    d = tmp_path / "keys"
    r = rlfleet("keys", "--dir", str(d))
    assert r.returncode == 0, r.stdout
    for name in ("server", "learner", "actor", "evaluator"):
        secret_file = d / f"{name}.key_secret"
        public_file = d / ("server.key" if name == "server" else f"clients/{name}.key")
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        public, secret = zmq.auth.load_certificate(secret_file)
        assert secret is not None and zmq.curve_public(secret) == public
        assert zmq.auth.load_certificate(public_file) == (public, None)  # public files hold no secret
        assert f"fingerprint {fingerprint(public)}" in r.stdout and str(secret_file) in r.stdout
    before = {p: p.read_bytes() for p in d.rglob("*.key*")}

    again = rlfleet("keys", "--dir", str(d))
    assert again.returncode == 2
    assert "keys exist already" in again.stdout and "--force" in again.stdout
    assert {p: p.read_bytes() for p in d.rglob("*.key*")} == before

    more = rlfleet("keys", "--dir", str(d), "--no-server", "--client", "actor-hostb")
    assert more.returncode == 0, more.stdout
    assert (d / "clients" / "actor-hostb.key").exists() and (d / "actor-hostb.key_secret").exists()
    assert (d / "server.key_secret").read_bytes() == before[d / "server.key_secret"]

    forced = rlfleet("keys", "--dir", str(d), "--force")
    assert forced.returncode == 0, forced.stdout
    assert (d / "server.key_secret").read_bytes() != before[d / "server.key_secret"]
    assert stat.S_IMODE((d / "server.key_secret").stat().st_mode) == 0o600


def _curve_cfg(keys: Path, **fields: str) -> config.Experiment:
    sets = ["security.mode=curve", f"security.keys_dir={keys}", *(f"security.{k}={v}" for k, v in fields.items())]
    return config.load(sets=sets, environ={})


def test_missing_and_bad_keys_are_named_with_the_field(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    security.make_keys(keys)
    assert security.server_curve(_curve_cfg(keys)) is not None
    assert security.client_curve(_curve_cfg(keys), "actor") is not None

    def refused(cfg: config.Experiment, role: str, *words: str) -> None:
        with pytest.raises(config.ConfigError) as info:
            security.server_curve(cfg) if role == "server" else security.client_curve(cfg, role)
        for w in words:
            assert w in str(info.value), (w, str(info.value))

    refused(_curve_cfg(tmp_path / "nowhere"), "server", "security.server_secret_key", "no such file", "rlfleet keys")
    refused(_curve_cfg(tmp_path / "nowhere"), "learner", "security.server_key", "no such file")
    refused(_curve_cfg(keys), "nobody", "security.client_key", "nobody.key_secret", "no such file")
    garbage = tmp_path / "garbage.key_secret"
    garbage.write_text("hello\n")
    refused(_curve_cfg(keys, client_key=str(garbage)), "actor", "security.client_key", "not a ZeroMQ certificate")
    short = tmp_path / "short.key_secret"
    short.write_text('curve\n    public-key = "abc"\n    secret-key = "def"\n')
    refused(_curve_cfg(keys, server_secret_key=str(short)), "server", "security.server_secret_key", "40-character")
    refused(_curve_cfg(keys, client_key=str(keys / "clients" / "actor.key")), "actor", "holds no secret-key")
    a_pub, _ = zmq.auth.load_certificate(keys / "actor.key_secret")
    _, l_sec = zmq.auth.load_certificate(keys / "learner.key_secret")
    mixed = tmp_path / "mixed.key_secret"
    mixed.write_text(f'curve\n    public-key = "{a_pub.decode()}"\n    secret-key = "{l_sec.decode()}"\n')
    refused(_curve_cfg(keys, client_key=str(mixed)), "actor", "does not belong to its secret-key")
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(_curve_cfg(keys, allowed_clients=str(empty)), "server", "security.allowed_clients", "no .key file")

    # environment overrides reach the security section like any other
    env = {"RLFLEET_SECURITY__MODE": "curve", "RLFLEET_SECURITY__KEYS_DIR": str(keys),
           "RLFLEET_SECURITY__CLIENT_KEY": str(keys / "evaluator.key_secret")}
    cfg = config.load(environ=env)
    curve = security.client_curve(cfg, "actor")
    assert curve is not None and curve.public_key == zmq.auth.load_certificate(keys / "evaluator.key_secret")[0]
    with pytest.raises(config.ConfigError, match="security.mode"):
        config.load(environ={"RLFLEET_SECURITY__MODE": "tls"})


def test_rlfleet_up_uses_configured_keys_or_makes_a_throwaway_set(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    plain = config.load(CONFIGS / "cartpole-dqn.yaml", environ={})
    assert security.local_keys(plain, run) == (plain, [])  # mode none: nothing to do

    # no key anywhere: a throwaway set for this run, and the run's config points at it
    cfg, made = security.local_keys(_curve_cfg(tmp_path / "nowhere"), run)
    assert cfg.security.keys_dir == str(run / "keys") and len(made) == 8
    assert all(stat.S_IMODE(k.path.stat().st_mode) == 0o600 for k in made if k.secret)
    security.check(cfg)
    assert not (tmp_path / "nowhere").exists()

    # configured keys that exist are used as they are
    keys = tmp_path / "keys"
    security.make_keys(keys)
    mine = _curve_cfg(keys)
    assert security.local_keys(mine, tmp_path / "run2") == (mine, [])
    assert not (tmp_path / "run2" / "keys").exists()

    # some but not all: a mistake, not a reason to invent keys
    (keys / "evaluator.key_secret").unlink()
    with pytest.raises(config.ConfigError, match=r"security.client_key = '.*evaluator.key_secret': no such file"):
        security.local_keys(mine, tmp_path / "run3")


def test_a_service_without_its_keys_says_which_and_exits(tmp_path: Path) -> None:
    port = free_tcp_port()
    svc = ServiceProcess("replay", tmp_path, [f"network.replay=[tcp://127.0.0.1:{port}]", "security.mode=curve",
                                              f"security.keys_dir={tmp_path / 'none'}"])
    assert svc.proc.wait(60) == 1
    assert "security.server_secret_key" in svc.log() and "no such file" in svc.log()


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def test_metrics_bind_to_the_chosen_interface(tmp_path: Path) -> None:
    # 127.0.0.2 is a loopback address of its own on Linux: bound there, 127.0.0.1 must not answer
    port = free_tcp_port()
    svc = ServiceProcess("paramserver", tmp_path, [f"network.paramserver=[tcp://127.0.0.1:{port}]",
                                                   "metrics.host=127.0.0.2"])
    try:
        deadline = time.monotonic() + 30
        while not _http_ok(f"http://127.0.0.2:{svc.metrics_port}/metrics"):
            assert svc.alive() and time.monotonic() < deadline, svc.log()
            time.sleep(0.1)
        assert not _http_ok(f"http://127.0.0.1:{svc.metrics_port}/metrics")
    finally:
        svc.stop()
    bad = ServiceProcess("paramserver", tmp_path, [f"network.paramserver=[tcp://127.0.0.1:{free_tcp_port()}]",
                                                   "metrics.host=192.0.2.1"])  # TEST-NET: not this host
    assert bad.proc.wait(60) == 1
    assert "metrics.host='192.0.2.1'" in bad.log() and "cannot bind" in bad.log()


# -- strangers ---------------------------------------------------------------------------


def _raw_tcp_stranger(address: str, messages: int) -> None:
    """A ZMTP 3.0 peer that claims the NULL mechanism and writes ``messages`` messages regardless."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    header = encode(Message("info", {}, sender="raw", seq=1))[0]
    frame = b"\x00" + bytes([len(header)]) + header if len(header) < 256 else b""
    stream = greeting + b"\x04" + bytes([len(ready)]) + ready + frame * messages
    with socket.create_connection((host, int(port)), timeout=5) as s:
        try:
            s.sendall(stream)
            s.recv(4096)
        except OSError:
            pass  # the server hangs up on us: that is the point


class Strangers:
    """A fresh CurveZMQ key pair, a plain-text client and a raw TCP writer: ``n`` messages each to one server.

    A refused handshake drops what the client's socket had queued and libzmq
    does not retry it, so a stranger opens a new connection and goes on, as
    a persistent one would: every connection is refused anew.
    """

    def __init__(self, address: str, server_key: bytes, make: object, n: int = STRANGER_MESSAGES) -> None:
        pub, sec = zmq.curve_keypair()
        self.key = CurveConfig(public_key=pub, secret_key=sec, server_key=server_key)
        self.sent = self.connections = 0
        deadline = time.monotonic() + 60
        for curve in (self.key, None):
            sock = make_socket(zmq.DEALER, connect=address, curve=curve, hwm=2 * n)
            self.connections += 1
            for i in range(n):
                msg = make(i)  # type: ignore[operator]
                msg.sender, msg.seq = f"stranger-{i % 7}", i + 1
                frames = encode(msg)
                while True:
                    try:
                        sock.send_multipart(frames, flags=zmq.NOBLOCK)
                        break
                    except zmq.Again:  # refused: the socket has no connection left
                        assert time.monotonic() < deadline, f"only {i} of {n} messages left the stranger"
                        sock.close(linger=0)
                        sock = make_socket(zmq.DEALER, connect=address, curve=curve, hwm=2 * n)
                        self.connections += 1
                self.sent += 1
            time.sleep(0.2)  # let the last connection be refused before closing it
            sock.close(linger=0)
        _raw_tcp_stranger(address, n)
        self.sent += n

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key.public_key)


@pytest.fixture
def curve_fleet(tmp_path: Path):  # type: ignore[no-untyped-def]
    keys = tmp_path / "keys"
    assert rlfleet("keys", "--dir", str(keys)).returncode == 0
    replay, params = f"tcp://127.0.0.1:{free_tcp_port()}", f"tcp://127.0.0.1:{free_tcp_port()}"
    sets = [f"network.replay=[{replay}]", f"network.paramserver=[{params}]", "replay.tables.0.min_size=10",
            "replay.tables.0.samples_per_insert=null", "replay.tables.0.columns=first_insert",
            "security.mode=curve", f"security.keys_dir={keys}"]
    procs = [ServiceProcess("replay", tmp_path, sets), ServiceProcess("paramserver", tmp_path, sets)]
    try:
        for p in procs:
            p.wait_healthy()
        yield config.load(CONFIGS / "cartpole-dqn.yaml", sets=sets, environ={}), procs[0], procs[1]
    finally:
        for p in procs:
            p.stop()


def _serve_the_fleet(cfg: config.Experiment, version: int, rows: int) -> None:
    """What the allowed fleet does: an actor inserts, the learner samples and publishes, an actor reads."""
    # the actor's key, from the config; a new sender id per client, as actors do
    with InsertClient.from_config(cfg, 0, f"actor-0/v{version}") as ic:
        ic.insert("main", transitions(0, version * rows, rows), timeout_s=10)
        ic.flush(10)
        assert ic.resends == 0
    with SampleClient.from_config(cfg, "learner", batch_size=8) as sc:
        assert sc.sample(timeout_s=10).data["obs"].shape == (8, 4)
    pub = WeightsPublisher(cfg.network.paramserver, "learner", curve=security.client_curve(cfg, "learner"))
    reader = WeightsReader(cfg.network.paramserver, "actor-0", curve=security.client_curve(cfg, "actor"))
    try:
        pub.publish(version, {"w": np.full(16, version, np.float32)}, timeout_s=10)
        got = reader.get(-1, timeout_s=10)
        assert got is not None and got[0] == version and float(got[1]["w"][0]) == version
    finally:
        pub.close()
        reader.close()


@pytest.mark.chaos
def test_strangers_reach_no_handler_and_the_allowed_fleet_is_served(curve_fleet) -> None:  # type: ignore[no-untyped-def]
    cfg, replay, params = curve_fleet
    _serve_the_fleet(cfg, 1, 50)
    server_key = zmq.auth.load_certificate(Path(cfg.security.keys_dir) / "server.key")[0]
    before = {svc.name: svc.metrics() for svc in (replay, params)}

    batch = transitions(9, 0, 1)
    to_replay = Strangers(cfg.network.replay[0], server_key,
                          lambda i: Message("insert", {"table": "main", "window_start": i + 1}, dict(batch)))
    to_params = Strangers(cfg.network.paramserver[0], server_key,
                          lambda i: Message("hello", {"actor_id": f"s{i}", "role": "actor"}) if i % 2
                          else Message("get", {"have_version": -1}))
    assert to_replay.sent == to_params.sent == 3 * STRANGER_MESSAGES
    _serve_the_fleet(cfg, 2, 50)
    _serve_the_fleet(cfg, 3, 50)

    for svc, strangers in ((replay, to_replay), (params, to_params)):
        m = svc.metrics()
        assert svc.alive()
        assert svc.total("rlfleet_protocol_errors_total") == 0  # nothing of theirs was even decoded
        rejected = {dict(labels)["reason"]: v for (n, labels), v in m.items() if n == "rlfleet_auth_rejected_total"}
        assert rejected.get("unknown_key", 0) >= 1 and rejected.get("handshake", 0) >= 1, rejected
        log = svc.log()
        assert log.count(f"fingerprint {strangers.fingerprint}") == 1, log  # logged once, however often refused
        assert log.count("refused a connection whose handshake failed") == 1, log
        assert log.count("not allowlisted") == 1, log  # the stranger was the only one refused
        assert rejected["unknown_key"] + rejected["handshake"] >= strangers.connections  # each one refused
        # every message in came from the allowed fleet: the same traffic as before, twice more
        ins = ("rlfleet_messages_total", frozenset({("type", "insert"), ("direction", "in")}))
        hello = ("rlfleet_messages_total", frozenset({("type", "hello"), ("direction", "in")}))
        assert m.get(hello, 0) == 0
        if svc is replay:
            assert m[ins] == 3 * before["replay"][ins]
            assert m[("rlfleet_replay_inserts_total", frozenset({("table", "main")}))] == 3 * 50
        else:
            assert m[("rlfleet_paramserver_publishes_total", frozenset())] == 3
            assert m.get(("rlfleet_paramserver_live_actors", frozenset()), 0) == 0


# -- end to end -----------------------------------------------------------------------------


@pytest.mark.e2e
def test_rlfleet_up_trains_with_curve_on_throwaway_keys(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    r = rlfleet("up", "--config", str(CONFIGS / "cartpole-dqn.yaml"), "--actors", "1", "--max-env-steps", "6000",
                "--max-seconds", "150", "--runs", str(runs), "--set", "security.mode=curve",
                "--set", "replay.tables.0.min_size=500", timeout=300)
    assert r.returncode == 0, r.stdout
    run = only_run_dir(runs)
    assert "made a throwaway set" in r.stdout
    resolved = yaml.safe_load((run / "config.yaml").read_text())["security"]
    assert resolved["mode"] == "curve" and resolved["keys_dir"] == str(run / "keys")
    assert stat.S_IMODE((run / "keys" / "server.key_secret").stat().st_mode) == 0o600
    rows = read_csv(run / "progress.csv")
    assert max(float(x["updates"]) for x in rows) > 0  # sampled from replay, over curve
    assert max(float(x["weights_version"]) for x in rows) > 0  # published to the paramserver and read back
    assert max(float(x["env_steps"]) for x in rows) >= 6000
    for log in (run / "logs").glob("*.log"):
        assert "refused" not in log.read_text(), log  # every member's key was allowlisted


@pytest.mark.chaos
def test_a_client_whose_key_is_not_allowlisted_is_told_its_fingerprint(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    security.make_keys(keys)
    (keys / "clients" / "actor.key").unlink()  # the actor's key is no longer allowlisted
    actor_fp = fingerprint(zmq.auth.load_certificate(keys / "actor.key_secret")[0])
    sets = [f"network.paramserver=[tcp://127.0.0.1:{free_tcp_port()}]", "network.timeout_s=3",
            "security.mode=curve", f"security.keys_dir={keys}"]
    params = ServiceProcess("paramserver", tmp_path, sets).wait_healthy()
    try:
        actor = ServiceProcess("actor", tmp_path, sets)
        assert actor.proc.wait(90) == 1
        # both ends name the same key: the operator can match the refusal to the client
        assert f"(fingerprint {actor_fp}) in the servers' allowlist" in actor.log(), actor.log()
        assert params.log().count(f"not allowlisted (fingerprint {actor_fp})") == 1, params.log()
        assert params.metric("rlfleet_auth_rejected_total", reason="unknown_key") >= 1
    finally:
        params.stop()


def test_with_curve_a_sender_id_belongs_to_its_key(tmp_path: Path) -> None:
    """Another allowlisted key that uses a victim's sender id (and its next seqs) reaches only a sender
    of its own: the victim's next inserts are stored, not acked as duplicates; the victim's resends
    over a new connection with its own key are still recognised."""
    from harness.replay_helpers import replay_config, serving
    from rlfleet.common.wire.dedup import MAX_AHEAD

    server_pub, server_sec = zmq.curve_keypair()
    victim, spoofer = zmq.curve_keypair(), zmq.curve_keypair()
    server_curve = CurveConfig(public_key=server_pub, secret_key=server_sec,
                               allowed_clients=[victim[0], spoofer[0]])
    with serving(replay_config(capacity=1000, min_size=1), curve=server_curve) as server:
        def insert(key: tuple[bytes, bytes], seq: int) -> Message:
            sock = make_socket(zmq.DEALER, connect=server.endpoint,
                               curve=CurveConfig(public_key=key[0], secret_key=key[1], server_key=server_pub))
            try:
                msg = Message("insert", {"table": "main", "window_start": seq}, transitions(0, seq, 1),
                              sender="actor-0/0123", seq=seq)
                sock.send_multipart(encode(msg))
                assert sock.poll(10_000)
                return decode(sock.recv_multipart())
            finally:
                sock.close(linger=0)

        assert insert(victim, 1)["stored"] == 1
        for seq in (2, 3, MAX_AHEAD):  # the spoofer takes the victim's next seqs
            assert insert(spoofer, seq)["stored"] == 1
        for seq in (2, 3):  # ... which are the victim's still
            reply = insert(victim, seq)
            assert reply["stored"] == 1 and reply["duplicate"] is False, reply.body
        assert insert(victim, 3)["duplicate"] is True  # a resend on a new connection: recognised
        assert len(server.dedup.senders) == 2
        assert all(name.startswith("actor-0/0123@") for name in server.dedup.senders)
        assert server.tables["main"].size == 6
        # a client's usual inserts take the fast path under CurveZMQ too, as its own sender
        with InsertClient(server.endpoint, "actor-0/4567",
                          curve=CurveConfig(public_key=victim[0], secret_key=victim[1], server_key=server_pub)) as ic:
            for i in range(20):
                ic.insert("main", transitions(1, i, 1), timeout_s=10)
            ic.flush(10)
        assert server.fast_inserts >= 10 and server.tables["main"].size == 26
