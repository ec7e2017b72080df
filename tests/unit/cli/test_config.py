"""The experiment file: precedence file < env < --set, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.common import config

ROOT = Path(__file__).resolve().parents[3]
CARTPOLE = ROOT / "configs" / "cartpole-dqn.yaml"


def test_every_shipped_config_validates() -> None:
    files = sorted((ROOT / "configs").glob("*.yaml"))
    assert files
    for f in files:
        config.load(f, environ={})


def test_precedence_file_then_env_then_cli() -> None:
    base = config.load(CARTPOLE, environ={})
    env = {"RLFLEET_ACTOR__POLL_EVERY": "7", "RLFLEET_REPLAY__DURABILITY": "checkpoint", "RLFLEET_SEED": "9"}
    cfg = config.load(CARTPOLE, environ=env)
    assert (cfg.actor.poll_every, cfg.replay.durability, cfg.seed) == (7, "checkpoint", 9)
    assert base.actor.poll_every != 7
    cfg = config.load(CARTPOLE, sets=["replay.durability=wal", "replay.tables.0.capacity=5000"], environ=env)
    assert (cfg.replay.durability, cfg.replay.tables[0].capacity, cfg.actor.poll_every) == ("wal", 5000, 7)


def test_env_lists_parse_as_yaml() -> None:
    env = {"RLFLEET_NETWORK__REPLAY": "[tcp://replay:5550, tcp://replay-1:5550]", "RLFLEET_REPLAY__SHARDS": "2"}
    cfg = config.load(CARTPOLE, environ=env)
    assert cfg.network.replay == ["tcp://replay:5550", "tcp://replay-1:5550"]
    assert cfg.bind_address("replay", 1) == "tcp://*:5550"


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["replay.tables.0.kind=lifo"], ["replay.tables.0.kind", "'lifo'", "'uniform', 'prioritized' or 'queue'"]),
        (["algorithm.gamma=2"], ["algorithm.gamma", "2", "less than or equal to 1"]),
        (["env.num_envs=0"], ["env.num_envs", "0", "greater than or equal to 1"]),
        (["env.bogus=1"], ["env.bogus", "unknown field", "num_envs"]),
        (["sync=barrier"], ["samples_per_insert", "deadlock", "null"]),
        (["replay.tables.0.samples_per_insert=8", "replay.tables.0.error_buffer=3"],
         ["error_buffer=3.0", "2 x max(1, samples_per_insert)", ">= 16.0"]),
        (["security.mode=tls"], ["security.mode", "'tls'", "'none' or 'curve'"]),
        (["actor.max_unacked=5000"], ["actor.max_unacked", "5000", "less than or equal to 4096"]),
        (["learner.table=other"], ["learner.table='other'", "'main'"]),
        (["replay.shards=2"], ["network.replay", "one address per shard"]),
        (["learner.device=tpu"], ["learner.device", "'tpu'"]),
        (["algorithm.name=sarsa"], ["algorithm", "sarsa"]),
        (["algorithm.epsilon_decay_steps=1000", "algorithm.epsilon_start=0.01"],
         ["epsilon_start=0.01", "epsilon=", "allowed: epsilon_start >= epsilon"]),
        (["algorithm.epsilon_decay_steps=0"], ["algorithm.epsilon_decay_steps", "0", "greater than or equal to 1"]),
    ],
)
def test_errors_name_field_value_and_what_is_allowed(sets: list[str], words: list[str]) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load(CARTPOLE, sets=sets, environ={})
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_bad_files_and_flags(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="does not exist"):
        config.load(tmp_path / "nope.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        config.load(bad, environ={})
    bad.write_text("- a list\n")
    with pytest.raises(config.ConfigError, match="mapping"):
        config.load(bad, environ={})
    with pytest.raises(config.ConfigError, match="FIELD=VALUE"):
        config.load(CARTPOLE, sets=["replay.durability"], environ={})
    with pytest.raises(config.ConfigError, match="out of range"):
        config.load(CARTPOLE, sets=["replay.tables.3.capacity=1"], environ={})


def test_dump_round_trips(tmp_path: Path) -> None:
    cfg = config.load(CARTPOLE, sets=["seed=3"], environ={})
    out = tmp_path / "resolved.yaml"
    out.write_text(config.dump(cfg))
    assert config.load(out, environ={}) == cfg
