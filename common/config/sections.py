"""The sections of the experiment file that configure the services: every field with
its default, its bounds and what it means (its description is what ``--help`` and the
docs show). :class:`Strict` refuses unknown fields, so a misspelt one is an error."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


PosInt = Annotated[int, Field(ge=1)]
NonNegFloat = Annotated[float, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]


class AlgorithmSettings(Strict):
    """Base of every algorithm's config class (``common/algorithms/<name>/config.py``)."""

    #: replay table kinds the algorithm can learn from (the experiment checks the learner's table)
    table_kinds: ClassVar[tuple[str, ...]] = ()

    def check_fleet(self, sync: str, actors: int, num_envs: int, steps_per_round: int) -> list[str]:
        """Problems of this section with a fleet of ``actors`` actors of ``num_envs`` envs each (barrier
        rounds of ``steps_per_round`` vector steps), found at start-up, e.g. a barrier round that does
        not split into minibatches; each names the field, the value and what is allowed."""
        return []

    def trains_with_workers(self) -> bool:
        """True when this experiment trains through gradient workers (the algorithm's ``make_worker``:
        every actor computes and pushes gradients, the paramserver's shards apply them) instead of a
        learner: the fleet then runs no replay and no learner."""
        return False


class ColoredNoiseSettings(AlgorithmSettings):
    """Exploration noise of continuous-action actors (SAC, TD3) with a colour: the Gaussian noise of each
    env lane and action dimension is drawn as a sequence whose power falls as 1/f^noise_color (0: white,
    each step independent, as SB3; 1: pink; 2: red, a random walk's). Eberhard et al. 2023 ("Pink noise is
    all you need"): temporally correlated noise carries an actor across a valley that white noise of the
    same scale only jitters in (MountainCarContinuous)."""

    noise_color: Annotated[float, Field(ge=0, le=2)] = Field(
        0.0, description="exponent beta of the exploration noise's 1/f^beta spectrum: 0 white (independent"
        " steps), 1 pink, 2 red; allowed 0 to 2")
    noise_length: Annotated[int, Field(ge=16)] = Field(
        1000, description="coloured noise: the length of each generated sequence per env lane (its lowest"
        " frequency is 1/noise_length); about an episode")


class AtariConfig(Strict):
    """The standard Atari preprocessing (Mnih et al. 2015; Machado et al. 2018), applied to every
    ``ALE/...`` env id. The training-only parts (episodic life, reward clipping) are left out of
    evaluations, which play whole games and score their real rewards."""

    frame_stack: PosInt = Field(4, description="frames stacked into one observation (the stack axis first)")
    frame_skip: PosInt = Field(4, description="emulator frames per agent step (the last two max-pooled)")
    screen_size: Annotated[int, Field(ge=36)] = Field(84, description="frames resized to this square, grayscale")
    noop_max: Annotated[int, Field(ge=0)] = Field(30, description="up to this many no-op steps after a reset")
    terminal_on_life_loss: bool = Field(
        True, description="training: a lost life ends the episode for learning (the game goes on; SB3's"
        " EpisodicLifeEnv)")
    clip_rewards: bool = Field(True, description="training: rewards clipped to their sign")
    fire_reset: bool = Field(True, description="press FIRE after each reset in games that need it to start")


class EnvConfig(Strict):
    id: str = Field("CartPole-v1", description="a registered gymnasium id, or 'module:Class' / 'module:function' "
                    "(an Env subclass, or a function returning an Env, called with env.kwargs) for your own env")
    imports: list[str] = Field(default_factory=list, description="modules imported before env.id is resolved "
                               "(a package whose import runs gymnasium.register)")
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
    atari: AtariConfig = Field(default_factory=lambda: AtariConfig(), description="ALE/... ids: preprocessing")


class ActorConfig(Strict):
    count: PosInt = Field(2, description="actors the local launcher starts (compose: --scale)")
    insert_batch: PosInt = Field(64, description="items (transitions, segments) per insert message")
    insert_bytes: PosInt = Field(
        256 << 10, description="an insert also goes once the items waiting hold this many bytes (large items:"
        " trajectory segments of many steps go at once instead of waiting for insert_batch of them)"
    )
    max_unacked: Annotated[int, Field(ge=1, le=4096)] = Field(
        32, description="un-acked inserts before the actor waits (replay remembers 4,096 per actor);"
        " also how far (in inserts) an actor runs ahead of a rate limiter that holds its acks"
    )
    coalesce_inserts: Annotated[int, Field(ge=1, le=64)] = Field(
        8, description="inserts made while earlier ones are un-acked go merged, up to this many, into one message"
        " sent once nothing is in flight (or this many wait): fewer, larger messages to a busy replay; never into"
        " a queue table or past a quarter of a table; 1 turns it off (so does max_unacked < 2 x coalesce_inserts)"
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
    columns: Literal["algorithm", "first_insert"] = Field(
        "algorithm", description="the learner's table (and planning.table): fixed at start to the columns the "
        "algorithm's actors insert (algorithm), or by its first insert (first_insert: a table your own clients "
        "fill); other tables: always first_insert")
    frames: Literal["auto", "off"] = Field(
        "auto", description="auto: uniform and prioritized tables store each frame of image-stack columns (uint8"
        " [stack, h, w]: obs and next_obs of Atari) once, and rebuild the stacks when sampled; off: every item"
        " keeps its own stacks")

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
    max_held_inserts: PosInt = Field(10_000, description="inserts held by the rate limiter per table; "
                                     "beyond, an insert is dropped (its sender resends it)")
    max_held_mib: PosInt = Field(256, description="bytes of all held inserts (MiB); beyond, dropped likewise")

    @model_validator(mode="after")
    def _unique(self) -> ReplayConfig:
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be unique, got {names}")
        return self


class LearnerConfig(Strict):
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$",
                        description="auto: CUDA where torch can use a GPU and the published networks hold at "
                        "least 100,000 parameters, else CPU; the learner logs and exports its choice")
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
    rendezvous: str = Field(
        "tcp://127.0.0.1:29400", pattern=r"^tcp://[^:/]+:\d+$",
        description="learners > 1: where the ranks meet (the first learner to start listens there; the "
        "others connect); its host must be the first learner's")
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="learners > 1: collective backend; "
                                                     "auto: nccl (gloo for CPU tensors) on CUDA, gloo on CPU")
    collective_timeout_s: PosFloat = Field(
        60.0, description="learners > 1: a rank that waits this long on the others (joining, or in a gradient "
        "all-reduce) stops with an error instead of hanging")


class GradientsConfig(Strict):
    """How a shard applies the gradients workers push (``push_gradients``) to its slice of the weights."""

    optimizer: Literal["adam", "rmsprop", "sgd"] = Field("adam", description="each shard's optimizer for its slice")
    lr: PosFloat = Field(7e-4, description="learning rate")
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="adam: moment decay rates")
    alpha: Annotated[float, Field(ge=0, lt=1)] = Field(0.99, description="rmsprop: squared-gradient decay")
    eps: PosFloat = Field(1e-8, description="adam, rmsprop: added to the denominator")
    momentum: Annotated[float, Field(ge=0, lt=1)] = Field(0.0, description="sgd, rmsprop: momentum")
    lr_final: NonNegFloat | None = Field(
        None, description="the learning rate falls linearly from lr to this over lr_decay_steps of the shard's"
        " optimizer steps (pushes applied), then stays; null: constant lr (SB3's linear schedule: 0)")
    lr_decay_steps: PosInt = Field(100_000, description="optimizer steps over which lr falls to lr_final")

    def lr_at(self, steps: int) -> float:
        """The learning rate of the ``steps``-th optimizer step (1 is the first)."""
        if self.lr_final is None:
            return self.lr
        return self.lr + (self.lr_final - self.lr) * min(1.0, (steps - 1) / self.lr_decay_steps)

    @property
    def moment_decays(self) -> tuple[float, float]:
        """adam: the decay rates of the first and second moments (Adam's ``betas``)."""
        return self.betas
    max_staleness: Annotated[int, Field(ge=0)] = Field(
        8, description="async: a push computed on weights more than this many versions older than the shard's"
        " newest is refused (stale_gradients) and counted")
    checkpoint_every_s: PosFloat = Field(
        30.0, description="a shard that applies gradients writes its weights, optimizer state and version to"
        " <run_dir>/paramserver/shard-<i>.npz this often (and on SIGTERM); a restarted shard goes on from it")


DEFAULT_MAX_GRADIENT_NORM = 1e4


class ParamServerConfig(Strict):
    shards: PosInt = Field(1, description="servers the weights are split across")
    liveness_timeout_s: PosFloat = Field(5.0, description="an actor silent this long leaves the registry")
    max_members: PosInt = Field(
        10_000, description="live actors and evaluators shard 0's registry holds; a hello or heartbeat that would"
        " register one more is refused (too_many_members) until one leaves or expires")
    gradients: GradientsConfig = Field(default_factory=GradientsConfig)
    max_gradient_norm: PosFloat = Field(
        DEFAULT_MAX_GRADIENT_NORM,
        description="a gradient push whose L2 norm is larger (on each shard: the norm of that shard's slice;"
        " with one shard, the global norm) is refused (bad_gradients) and changes nothing; workers that clip"
        " (A3C: algorithm.max_grad_norm 0.5) stay far below it, a poisoned push of 1e19 cannot wreck the"
        " optimizer state")


class NetworkConfig(Strict):
    """Connect addresses, one per shard. A server binds the port of its own address
    on ``bind_host`` (tcp), or the address itself (ipc, inproc)."""

    replay: list[str] = Field(default_factory=lambda: ["tcp://127.0.0.1:5550"], min_length=1)
    paramserver: list[str] = Field(default_factory=lambda: ["tcp://127.0.0.1:5560"], min_length=1)
    bind_host: str = Field("*", description="interface servers bind to ('*' = all)")
    interface: str | None = Field(None, description="network interface (e.g. eth0) for the fleet's traffic: "
                                  "servers bind its address instead of bind_host, learner ranks set "
                                  "GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME to it; null: bind_host, and gloo/NCCL choose")
    timeout_s: PosFloat = Field(10.0, description="give up on a peer after this long at start-up")
    max_message_mib: Annotated[int, Field(ge=1, le=4096)] = Field(
        512, description="largest message a server takes (MiB): a bigger one is refused by ZeroMQ "
        "(ZMQ_MAXMSGSIZE) before it is read whole; it must fit a weights publish")


class MetricsConfig(Strict):
    host: str = Field("0.0.0.0", description="interface /metrics and /healthz bind to")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(9100, description="0 picks a free port")


class LoggingConfig(Strict):
    """Where scalars go besides Prometheus and RUN_DIR/tensorboard (common/tboard.py, common/wandb_log.py)."""

    wandb: bool = Field(
        False, description="also log every TensorBoard scalar to Weights & Biases: a W&B run per service, grouped"
        " by the run, files in RUN_DIR/wandb; needs the wandb package (pip install wandb), not installed by"
        " rlfleet")
    wandb_project: str = Field("rlfleet", min_length=1, description="logging.wandb: the W&B project")
    wandb_entity: str | None = Field(None, description="logging.wandb: the W&B team or user; null: your default")
    wandb_group: str | None = Field(None, description="logging.wandb: the group of the run's W&B runs; null: the"
                                    " run directory's name (rlfleet up: <name>-<time>)")
    wandb_mode: Literal["online", "offline"] | None = Field(
        None, description="logging.wandb: offline keeps the runs in RUN_DIR/wandb (wandb sync uploads them later);"
        " null: the WANDB_MODE environment variable, else online")

    @model_validator(mode="after")
    def _installed(self) -> LoggingConfig:
        from rlfleet.common.wandb_log import missing_wandb

        why = missing_wandb() if self.wandb else None
        if why is not None:
            raise ValueError(f"wandb=true but {why}; or wandb: false")
        return self


class SecurityConfig(Strict):
    """CurveZMQ on every ZeroMQ socket (common/security.py; keys from ``rlfleet keys``).

    Servers (replay, paramserver) need ``server_secret_key`` and
    ``allowed_clients``; clients (learner, actors, evaluator) need
    ``server_key`` and ``client_key``. A path left null is the file
    ``rlfleet keys`` writes into ``keys_dir``. Files are checked when a
    service starts: an error names the field, the file and what is wrong.
    """

    mode: Literal["none", "curve"] = Field("none", description="none: plain TCP; curve: CurveZMQ + allowlist")
    insecure: bool = Field(False, description="with mode none, let replay and paramserver bind beyond loopback "
                           "(network.bind_host '*' or an address of the host): plain TCP on a network you trust")
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
