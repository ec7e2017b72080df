"""The ``algorithm:`` section for DQN. Imports only pydantic and common.config.sections:
the config is read where torch is not installed."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from rlfleet.common.config.sections import AlgorithmSettings, NonNegFloat, PosFloat, PosInt


class DQNConfig(AlgorithmSettings):
    """Ape-X DQN: double Q, dueling heads, n-step returns, prioritized replay."""

    table_kinds: ClassVar[tuple[str, ...]] = ("uniform", "prioritized")
    # global batch sizes: with several learners each takes 1/learners of them
    per_rank_fields: ClassVar[tuple[str, ...]] = ("batch_size",)

    name: Literal["dqn"] = "dqn"
    torso: Literal["auto", "mlp", "nature_cnn"] = Field(
        "auto", description="auto: the Nature CNN for image observations (uint8 [stack, h, w]), else an MLP")
    hidden: list[PosInt] = Field(default_factory=lambda: [256, 256], description="MLP layer widths (torso mlp)")
    dueling: bool = Field(True, description="separate value and advantage heads")
    double: bool = Field(True, description="double-Q targets (online argmax, target value)")
    gamma: Annotated[float, Field(gt=0, le=1)] = Field(0.99, description="discount")
    n_step: PosInt = Field(3, description="steps in the n-step return, built by the actor")
    lr: PosFloat = Field(5e-4, description="Adam learning rate")
    adam_eps: PosFloat = Field(1.5e-4, description="Adam epsilon")
    batch_size: PosInt = Field(128, description="transitions per update")
    huber_delta: PosFloat = Field(1.0, description="Huber loss threshold")
    grad_clip: PosFloat | None = Field(10.0, description="max gradient norm; null disables")
    update_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "float32", description="the learner's torso (hidden layers or CNN): bfloat16 = autocast (heads, targets,"
        " loss, optimizer and weights stay float32), faster on a CPU with AVX512-BF16 or AMX; auto = bfloat16"
        " where the device computes it natively, else float32; actors act in float32 either way")
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
    actor_priorities: bool = Field(
        True, description="actors compute each item's initial priority (Ape-X: two forward passes per item);"
        " false: items enter at the table's highest priority (cheaper acting with a CNN on CPU)")
    priorities_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="the actor's forward passes for initial priorities: auto = bfloat16 for a CNN where the"
        " device computes it natively (a CPU with AVX512-BF16 or AMX: 1.5x faster here, priorities within ~2%),"
        " else float32; the learner overwrites them with its own once sampled")
    hogwild: bool = Field(
        False, description="gradient workers instead of a learner (HogWild DQN): each actor keeps its own"
        " buffer, computes the loss's gradient on batches of it and pushes it to the paramserver, whose shards"
        " apply it (paramserver.gradients); no replay, no learner")
    hogwild_buffer: PosInt = Field(20_000, description="hogwild: transitions each worker keeps (its own ring)")
    hogwild_start: PosInt = Field(1_000, description="hogwild: transitions a worker holds before its first gradient")

    def trains_with_workers(self) -> bool:
        return self.hogwild

    @model_validator(mode="after")
    def _schedule(self) -> DQNConfig:
        if self.epsilon_decay_steps is not None and self.epsilon_start < self.epsilon:
            raise ValueError(
                f"epsilon_start={self.epsilon_start} is below epsilon={self.epsilon}: the schedule decays"
                f" towards the Ape-X values; allowed: epsilon_start >= epsilon"
            )
        return self
