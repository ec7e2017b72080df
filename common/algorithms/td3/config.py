"""The ``algorithm:`` section for TD3. Imports only pydantic and common.config.sections:
the config is read where torch is not installed.

Defaults are SB3's TD3 (Fujimoto et al. 2018): 400x300 ReLU actor and critics, lr 1e-3,
batch 256, tau 0.005, gamma 0.99, the actor and the targets stepped every 2nd critic update,
target policy smoothing noise 0.2 clipped at 0.5, Gaussian exploration noise 0.1 (noises in
units of half the action range), 100 env steps of uniform random actions before the policy acts.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from rlfleet.common.config.sections import ColoredNoiseSettings, PosFloat, PosInt


class TD3Config(ColoredNoiseSettings):
    """Twin delayed DDPG: deterministic actor, twin Q critics, delayed actor and target updates."""

    table_kinds: ClassVar[tuple[str, ...]] = ("uniform", "prioritized")
    # global batch sizes: with several learners each takes 1/learners of them
    per_rank_fields: ClassVar[tuple[str, ...]] = ("batch_size",)

    name: Literal["td3"] = "td3"
    hidden: list[PosInt] = Field(default_factory=lambda: [400, 300], description="actor MLP widths")
    critic_hidden: list[PosInt] | None = Field(None, description="critic MLP widths; null: as hidden")
    gamma: Annotated[float, Field(gt=0, le=1)] = Field(0.99, description="discount")
    n_step: PosInt = Field(1, description="steps in the n-step return, built by the actor")
    lr: PosFloat = Field(1e-3, description="Adam learning rate of actor and critics")
    batch_size: PosInt = Field(256, description="transitions per update")
    tau: Annotated[float, Field(gt=0, le=1)] = Field(
        0.005, description="Polyak rate of the target actor and critics (at each delayed update)")
    policy_delay: PosInt = Field(
        2, description="critic updates per actor update: the actor and the targets step on every policy_delay-th"
        " update (1: every update, as DDPG)")
    policy_noise: Annotated[float, Field(ge=0)] = Field(
        0.2, description="target policy smoothing: std of the Gaussian noise added to the target actor's action,"
        " in units of half the action range")
    noise_clip: Annotated[float, Field(ge=0)] = Field(
        0.5, description="target policy smoothing: the noise is clipped to [-noise_clip, noise_clip] (same units)")
    exploration_noise: Annotated[float, Field(ge=0)] = Field(
        0.1, description="actors: std of the Gaussian noise added to the actor's action, in units of half the"
        " action range (evaluators act without it)")
    learning_starts: Annotated[int, Field(ge=0)] = Field(
        100, description="fleet env steps of uniform random actions before actors act with the policy"
    )
    grad_clip: PosFloat | None = Field(None, description="max gradient norm per network; null disables")
    beta_start: Annotated[float, Field(ge=0, le=1)] = Field(0.4, description="prioritized: importance exponent")
    beta_updates: PosInt = Field(20_000, description="prioritized: updates over which beta anneals to 1")
