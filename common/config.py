"""The experiment file: one YAML read by every service.

Precedence, lowest first: the file, environment variables, ``--set`` flags.

- Environment: ``RLFLEET_<SECTION>__<FIELD>=value`` (``__`` between levels,
  list items by index), e.g. ``RLFLEET_REPLAY__DURABILITY=wal`` or
  ``RLFLEET_REPLAY__TABLES__0__CAPACITY=50000``. Values are parsed as YAML,
  so ``RLFLEET_NETWORK__REPLAY='[tcp://replay:5550]'`` is a list.
- CLI: ``--set replay.durability=wal`` (dots between levels).

Validation happens at start-up; every problem is reported with the field, the
bad value and what is allowed (:class:`ConfigError`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ENV_PREFIX = "RLFLEET_"


class ConfigError(ValueError):
    """A configuration that cannot run; the message names every bad field."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


PosInt = Annotated[int, Field(ge=1)]
NonNegFloat = Annotated[float, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]


class EnvConfig(Strict):
    id: str = Field("CartPole-v1", description="gymnasium id, or 'module:Class' for a custom env")
    num_envs: PosInt = Field(4, description="environments per actor, stepped as one vector env")
    vectorization: Literal["sync", "async", "threads"] = Field(
        "sync", description="gymnasium SyncVectorEnv (one process), AsyncVectorEnv (a process per env), or"
        " threads (one process, the envs step at once in a thread each: for envs that wait, not compute)"
    )
    step_latency_ms: NonNegFloat = Field(
        0.0, description="fixed extra latency per env step: what a remote simulator or robot costs"
    )
    max_episode_steps: PosInt | None = Field(None, description="override the env's time limit")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to gymnasium.make")


class DQNConfig(Strict):
    """Ape-X DQN: double Q, dueling heads, n-step returns, prioritized replay."""

    name: Literal["dqn"] = "dqn"
    hidden: list[PosInt] = Field(default_factory=lambda: [256, 256], description="MLP layer widths")
    dueling: bool = Field(True, description="separate value and advantage heads")
    double: bool = Field(True, description="double-Q targets (online argmax, target value)")
    gamma: Annotated[float, Field(gt=0, le=1)] = Field(0.99, description="discount")
    n_step: PosInt = Field(3, description="steps in the n-step return, built by the actor")
    lr: PosFloat = Field(5e-4, description="Adam learning rate")
    adam_eps: PosFloat = Field(1.5e-4, description="Adam epsilon")
    batch_size: PosInt = Field(128, description="transitions per update")
    huber_delta: PosFloat = Field(1.0, description="Huber loss threshold")
    grad_clip: PosFloat | None = Field(10.0, description="max gradient norm; null disables")
    target_update: Literal["hard", "polyak"] = Field("hard", description="how the target net follows")
    target_period: PosInt = Field(250, description="updates between hard target copies")
    tau: Annotated[float, Field(gt=0, le=1)] = Field(0.005, description="Polyak rate")
    beta_start: Annotated[float, Field(ge=0, le=1)] = Field(0.4, description="importance exponent at start")
    beta_updates: PosInt = Field(20_000, description="updates over which beta anneals to 1")
    epsilon: Annotated[float, Field(gt=0, lt=1)] = Field(0.4, description="Ape-X base epsilon")
    epsilon_alpha: NonNegFloat = Field(7.0, description="Ape-X: eps_i = eps^(1 + alpha*i/(N-1))")
    epsilon_decay_steps: PosInt | None = Field(
        None, description="fleet env steps over which each actor's epsilon falls linearly from epsilon_start to"
        " its Ape-X eps_i; null: eps_i from the start"
    )
    epsilon_start: Annotated[float, Field(gt=0, le=1)] = Field(
        1.0, description="every actor's epsilon at fleet step 0 (with epsilon_decay_steps)"
    )
    priority_eps: PosFloat = Field(1e-3, description="added to |TD error| to form a priority")

    @model_validator(mode="after")
    def _schedule(self) -> DQNConfig:
        if self.epsilon_decay_steps is not None and self.epsilon_start < self.epsilon:
            raise ValueError(
                f"epsilon_start={self.epsilon_start} is below epsilon={self.epsilon}: the schedule decays"
                f" towards the Ape-X values; allowed: epsilon_start >= epsilon"
            )
        return self


AlgorithmConfig = Annotated[DQNConfig, Field(discriminator="name")]


class ActorConfig(Strict):
    count: PosInt = Field(2, description="actors the local launcher starts (compose: --scale)")
    insert_batch: PosInt = Field(64, description="transitions per insert message")
    max_unacked: Annotated[int, Field(ge=1, le=4096)] = Field(
        32, description="insert messages in flight before the actor waits (replay remembers 4,096 per actor);"
        " also how far (in inserts) an actor runs ahead of a rate limiter that holds its acks"
    )
    max_unacked_bytes: PosInt = Field(
        64 << 20, description="bound on the bytes of un-acked inserts kept for resending while replay is away;"
        " when reached the actor blocks (no env steps) until replay acks again"
    )
    resend_after_s: PosFloat = Field(2.0, description="resend an un-acked insert after this long")
    poll_every: PosInt = Field(200, description="async: env steps (per env) between weight polls")
    steps_per_round: PosInt = Field(250, description="barrier: env steps (per env) per round")
    heartbeat_s: PosFloat = Field(1.0, description="seconds between registry heartbeats")
    torch_threads: PosInt = Field(1, description="torch intra-op threads for policy inference")
    acked_log: bool = Field(
        False, description="append every insert replay acked (seq, items) to RUN_DIR/acked/<actor id>.csv"
    )


class EvaluatorConfig(Strict):
    enabled: bool = Field(True, description="start an evaluator")
    episodes: PosInt = Field(10, description="greedy episodes per evaluation")
    every_s: NonNegFloat = Field(2.0, description="at most one evaluation this often (when every_steps is null)")
    every_steps: PosInt | None = Field(
        None, description="evaluate each time the fleet's env steps pass a multiple of this (e.g. 5000)"
    )
    epsilon: Annotated[float, Field(ge=0, lt=1)] = Field(0.0, description="exploration while evaluating")
    vectorization: Literal["sync", "async", "threads"] | None = Field(
        None, description="the evaluation's vector env (one slot per episode); null: env.vectorization. async"
        " (a process per episode) and threads (a thread per episode) step every episode at once: with a slow"
        " simulator (env.step_latency_ms) an evaluation then costs one episode's latency instead of the sum"
        " of all; threads at a fraction of async's CPU"
    )


class TableConfig(Strict):
    name: str = Field("main", min_length=1, max_length=64)
    kind: Literal["uniform", "prioritized", "queue"] = "prioritized"
    capacity: PosInt = 100_000
    alpha: Annotated[float, Field(ge=0)] = Field(0.6, description="prioritized: priority exponent")
    min_size: PosInt = Field(1000, description="items needed before sampling starts")
    samples_per_insert: PosFloat | None = Field(
        None, description="rate limiter: sampled items per inserted item; null = min size only"
    )
    error_buffer: PosFloat | None = Field(
        None, description="rate limiter slack in items; default 100 x max(1, samples_per_insert)"
    )

    @model_validator(mode="after")
    def _limiter(self) -> TableConfig:
        if self.samples_per_insert is not None and self.error_buffer is not None:
            need = 2 * max(1.0, self.samples_per_insert)
            if self.error_buffer < need:
                raise ValueError(
                    f"error_buffer={self.error_buffer} is narrower than 2 x max(1, samples_per_insert)"
                    f" = {need}: the limiter could deadlock; allowed: error_buffer >= {need}"
                )
        if self.min_size > self.capacity:
            raise ValueError(f"min_size={self.min_size} exceeds capacity={self.capacity}: sampling never starts")
        return self

    @property
    def effective_error_buffer(self) -> float:
        spi = self.samples_per_insert or 1.0
        return self.error_buffer if self.error_buffer is not None else 100.0 * max(1.0, spi)


class ReplayConfig(Strict):
    shards: PosInt = Field(1, description="independent replay servers; actors stick to one")
    tables: list[TableConfig] = Field(default_factory=lambda: [TableConfig()], min_length=1)
    durability: Literal["memory", "checkpoint", "wal"] = "memory"
    checkpoint_every_s: PosFloat = Field(60.0, description="checkpoint durability: snapshot period")
    dir: str = Field("replay", description="snapshots and logs (relative to the run directory)")

    @model_validator(mode="after")
    def _unique(self) -> ReplayConfig:
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be unique, got {names}")
        return self


class LearnerConfig(Strict):
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto picks CUDA when present")
    table: str = Field("main", description="replay table to train from")
    torch_threads: PosInt = Field(
        1, description="torch intra-op threads on CPU; small nets train fastest on one, beside other services"
    )
    samples_in_flight: PosInt = Field(
        4, description="sample requests kept in flight per shard; the next one goes out before each update, so 1 "
        "already overlaps replay with the update, and more draw from older priorities (barrier: at most the "
        "round's remaining updates, none across a barrier)"
    )
    publish_every: PosInt = Field(20, description="async: updates between published versions")
    updates_per_round: PosInt = Field(125, description="barrier: updates per round")
    checkpoint_every_s: PosFloat = Field(30.0, description="seconds between learner checkpoints")
    dir: str = Field("learner", description="checkpoints (relative to the run directory)")


class ParamServerConfig(Strict):
    shards: PosInt = Field(1, description="servers the weights are split across")
    liveness_timeout_s: PosFloat = Field(5.0, description="an actor silent this long leaves the registry")


class NetworkConfig(Strict):
    """Connect addresses, one per shard. A server binds the port of its own address
    on ``bind_host`` (tcp), or the address itself (ipc, inproc)."""

    replay: list[str] = Field(default_factory=lambda: ["tcp://127.0.0.1:5550"], min_length=1)
    paramserver: list[str] = Field(default_factory=lambda: ["tcp://127.0.0.1:5560"], min_length=1)
    bind_host: str = Field("*", description="interface servers bind to ('*' = all)")
    timeout_s: PosFloat = Field(10.0, description="give up on a peer after this long at start-up")


class MetricsConfig(Strict):
    host: str = Field("0.0.0.0", description="interface /metrics and /healthz bind to")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(9100, description="0 picks a free port")


class SecurityConfig(Strict):
    """CurveZMQ on every ZeroMQ socket (common/security.py; keys from ``rlfleet keys``).

    Servers (replay, paramserver) need ``server_secret_key`` and
    ``allowed_clients``; clients (learner, actors, evaluator) need
    ``server_key`` and ``client_key``. A path left null is the file
    ``rlfleet keys`` writes into ``keys_dir``. Files are checked when a
    service starts: an error names the field, the file and what is wrong.
    """

    mode: Literal["none", "curve"] = Field("none", description="none: plain TCP; curve: CurveZMQ + allowlist")
    keys_dir: str = Field("keys", description="what 'rlfleet keys --dir' wrote; the default for the paths below")
    server_key: str | None = Field(None, description="servers' public key (default <keys_dir>/server.key)")
    server_secret_key: str | None = Field(
        None, description="servers' key pair, replay and paramserver only (default <keys_dir>/server.key_secret)"
    )
    allowed_clients: str | None = Field(
        None, description="directory of allowlisted client public keys, *.key (default <keys_dir>/clients)"
    )
    client_key: str | None = Field(
        None, description="this client's key pair (default <keys_dir>/<learner|actor|evaluator>.key_secret)"
    )


class Experiment(Strict):
    name: str = Field("experiment", pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 0
    sync: Literal["barrier", "async"] = "async"
    env: EnvConfig = Field(default_factory=lambda: EnvConfig())
    algorithm: AlgorithmConfig = Field(default_factory=lambda: DQNConfig())
    actor: ActorConfig = Field(default_factory=lambda: ActorConfig())
    evaluator: EvaluatorConfig = Field(default_factory=lambda: EvaluatorConfig())
    replay: ReplayConfig = Field(default_factory=lambda: ReplayConfig())
    learner: LearnerConfig = Field(default_factory=lambda: LearnerConfig())
    paramserver: ParamServerConfig = Field(default_factory=lambda: ParamServerConfig())
    network: NetworkConfig = Field(default_factory=lambda: NetworkConfig())
    metrics: MetricsConfig = Field(default_factory=lambda: MetricsConfig())
    security: SecurityConfig = Field(default_factory=lambda: SecurityConfig())
    run_dir: str = Field("runs/current", description="where this run writes logs, CSVs and checkpoints")

    @model_validator(mode="after")
    def _cross(self) -> Experiment:
        problems = []
        tables = {t.name: t for t in self.replay.tables}
        if self.learner.table not in tables:
            problems.append(f"learner.table={self.learner.table!r}: allowed: one of {sorted(tables)}")
        if len(self.network.replay) != self.replay.shards:
            problems.append(
                f"network.replay has {len(self.network.replay)} addresses but replay.shards="
                f"{self.replay.shards}; allowed: one address per shard"
            )
        if len(self.network.paramserver) != self.paramserver.shards:
            problems.append(
                f"network.paramserver has {len(self.network.paramserver)} addresses but "
                f"paramserver.shards={self.paramserver.shards}; allowed: one address per shard"
            )
        table = tables.get(self.learner.table)
        if self.sync == "barrier" and table is not None and table.samples_per_insert is not None:
            problems.append(
                f"replay.tables[{self.learner.table}].samples_per_insert={table.samples_per_insert}"
                " with sync=barrier: the limiter could hold the learner inside a round while actors"
                " wait for the next version (deadlock); allowed: null (the round fixes the ratio)"
            )
        if self.algorithm.name == "dqn" and table is not None and table.kind == "queue":
            problems.append(
                f"replay.tables[{table.name}].kind='queue' with algorithm dqn; allowed: uniform, prioritized"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def bind_address(self, service: Literal["replay", "paramserver"], shard: int) -> str:
        return bind_address(getattr(self.network, service)[shard], self.network.bind_host)


def bind_address(connect: str, bind_host: str = "*") -> str:
    """The address a server binds for a connect address (tcp: same port on bind_host)."""
    if connect.startswith("tcp://"):
        port = connect.rsplit(":", 1)[1]
        return f"tcp://{bind_host}:{port}"
    return connect


# -- loading -----------------------------------------------------------------


def _set_path(tree: Any, path: list[str], value: Any, source: str) -> None:
    node = tree
    for i, key in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ConfigError(f"{source}: {'.'.join(path[: i + 1])}: index {key!r} out of range")
            idx = int(key)
            if last:
                node[idx] = value
            else:
                node = node[idx]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{source}: {'.'.join(path[:i])} is not a section")
        if last:
            node[key] = value
        else:
            node = node.setdefault(key, {})


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def env_overrides(environ: Mapping[str, str]) -> list[tuple[list[str], Any, str]]:
    out = []
    for key, text in sorted(environ.items()):
        if key.startswith(ENV_PREFIX) and "__" in key[len(ENV_PREFIX):] or key in _TOP_LEVEL_ENV:
            path = [p.lower() for p in key[len(ENV_PREFIX):].split("__")]
            out.append((path, _parse_value(text), f"environment {key}"))
    return out


_TOP_LEVEL_ENV = {f"{ENV_PREFIX}{name.upper()}" for name in ("name", "seed", "sync", "run_dir")}


def cli_overrides(sets: Iterable[str]) -> list[tuple[list[str], Any, str]]:
    out = []
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected FIELD=VALUE, e.g. --set replay.durability=wal")
        key, text = item.split("=", 1)
        out.append((key.strip().split("."), _parse_value(text), f"--set {key}"))
    return out


def load(
    path: str | Path | None = None,
    sets: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    data: Mapping[str, Any] | None = None,
) -> Experiment:
    """Read the experiment file, apply env and --set overrides, validate."""
    tree: dict[str, Any] = dict(data or {})
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
        tree.update(loaded)
    environ = os.environ if environ is None else environ
    for keys, value, source in [*env_overrides(environ), *cli_overrides(sets)]:
        _set_path(tree, keys, value, source)
    return validate(tree)


def validate(tree: Mapping[str, Any]) -> Experiment:
    try:
        return Experiment.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, tree)) from None


def format_errors(exc: ValidationError, tree: Mapping[str, Any]) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-after"))
        loc = loc.replace(".dqn", "") if loc.startswith("algorithm.dqn") else loc
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            lines.append(f"{loc}: unknown field; allowed fields: {_allowed_fields(loc)}")
        elif err["type"] in ("missing",):
            lines.append(f"{loc}: required field is missing")
        elif loc and err["type"] == "value_error" and isinstance(err.get("input"), dict):
            lines.append(f"{loc}: {msg}")
        elif loc:
            lines.append(f"{loc} = {err.get('input')!r}: {msg}")
        else:
            lines.append(msg)
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _allowed_fields(loc: str) -> str:
    model: Any = Experiment
    for part in loc.split(".")[:-1]:
        if part.isdigit():
            continue
        field = model.model_fields.get(part)
        if field is None:
            break
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        model = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), model)
    return ", ".join(sorted(model.model_fields))


def dump(cfg: Experiment) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
