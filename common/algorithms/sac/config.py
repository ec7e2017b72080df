"""The ``algorithm:`` section for SAC. Imports only pydantic and common.config.sections:
the config is read where torch is not installed.

Defaults are SB3's SAC (256x256 ReLU actor and critics, lr 3e-4, batch 256, tau 0.005,
gamma 0.99, automatic entropy temperature starting at 1 with target entropy -|A|,
100 env steps of uniform random actions before the policy acts).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from rlfleet.common.config.sections import ColoredNoiseSettings, PosFloat, PosInt


class SACConfig(ColoredNoiseSettings):
    """Soft actor-critic: tanh-squashed Gaussian actor, twin Q critics, learned temperature."""

    table_kinds: ClassVar[tuple[str, ...]] = ("uniform", "prioritized")
    # global batch sizes: with several learners each takes 1/learners of them
    per_rank_fields: ClassVar[tuple[str, ...]] = ("batch_size",)

    name: Literal["sac"] = "sac"
    hidden: list[PosInt] = Field(default_factory=lambda: [256, 256], description="actor MLP widths")
    critic_hidden: list[PosInt] | None = Field(None, description="critic MLP widths; null: as hidden")
    gamma: Annotated[float, Field(gt=0, le=1)] = Field(0.99, description="discount")
    n_step: PosInt = Field(1, description="steps in the n-step return, built by the actor")
    lr: PosFloat = Field(3e-4, description="Adam learning rate of actor, critics and temperature")
    batch_size: PosInt = Field(256, description="transitions per update")
    tau: Annotated[float, Field(gt=0, le=1)] = Field(0.005, description="Polyak rate of the target critics")
    ent_coef: PosFloat | Literal["auto"] = Field(
        "auto", description="entropy temperature alpha: a number keeps it fixed; 'auto' learns it towards"
        " target_entropy, starting at ent_coef_init"
    )
    ent_coef_init: PosFloat = Field(1.0, description="'auto': the temperature at the start")
    target_entropy: float | Literal["auto"] = Field(
        "auto", description="'auto': -(action dimensions); or a number"
    )
    learning_starts: Annotated[int, Field(ge=0)] = Field(
        100, description="fleet env steps of uniform random actions before actors act with the policy"
    )
    grad_clip: PosFloat | None = Field(None, description="max gradient norm per network; null disables")
    log_std_min: float = Field(-20.0, description="the actor's log std is clamped to [log_std_min, log_std_max]")
    log_std_max: float = Field(2.0, description="see log_std_min")
    update_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "float32", description="the learner's hidden-layer matmuls: bfloat16 = autocast (output layers, losses,"
        " optimizer and weights stay float32), ~2x faster on a CPU with AVX512-BF16 or AMX; auto = bfloat16"
        " where the device computes it natively, else float32")
    beta_start: Annotated[float, Field(ge=0, le=1)] = Field(0.4, description="prioritized: importance exponent")
    beta_updates: PosInt = Field(20_000, description="prioritized: updates over which beta anneals to 1")

    @model_validator(mode="after")
    def _bounds(self) -> SACConfig:
        if self.log_std_min >= self.log_std_max:
            raise ValueError(f"log_std_min={self.log_std_min} >= log_std_max={self.log_std_max}; allowed:"
                             " log_std_min < log_std_max")
        return self
