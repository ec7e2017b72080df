"""The ``algorithm:`` section for A3C. Imports only pydantic and common.config.sections:
the config is read where torch is not installed.

Defaults are SB3's A2C (n_steps 5, gamma 0.99, gae_lambda 1.0: n-step returns, ent_coef 0.0,
vf_coef 0.5, max_grad_norm 0.5; its RMSprop, lr 7e-4, alpha 0.99, eps 1e-5, is the
paramserver's ``paramserver.gradients`` section here, since the shards own the optimizer),
with a 64x64 tanh torso for each of the policy and value heads (``shared_torso: true``: one torso
under both, as in the A3C paper; on CartPole the value loss then slowed the policy about 2-4x).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from rlfleet.common.config.sections import AlgorithmSettings, NonNegFloat, PosFloat, PosInt


class A3CConfig(AlgorithmSettings):
    """A3C: gradient workers push n-step advantage actor-critic gradients to the paramserver shards."""

    #: no replay table: it trains through gradient workers (its Builder's worker)
    table_kinds: ClassVar[tuple[str, ...]] = ()

    def trains_with_workers(self) -> bool:
        return True

    name: Literal["a3c"] = "a3c"
    n_steps: PosInt = Field(5, description="env steps per env slot in each rollout a worker computes gradients on")
    gamma: Annotated[float, Field(gt=0, le=1)] = Field(0.99, description="discount")
    gae_lambda: Annotated[float, Field(ge=0, le=1)] = Field(
        1.0, description="GAE lambda; 1.0: plain n-step returns (A3C)")
    ent_coef: NonNegFloat = Field(0.0, description="entropy bonus weight")
    vf_coef: NonNegFloat = Field(0.5, description="value loss weight")
    max_grad_norm: PosFloat | None = Field(0.5, description="global gradient-norm clip on the worker; null disables")
    normalize_advantage: bool = Field(False, description="advantages to zero mean, unit std per rollout")
    hidden: list[PosInt] = Field(default_factory=lambda: [64, 64], description="torso MLP widths")
    shared_torso: bool = Field(
        False, description="true: one torso under the policy and value heads (the A3C paper's); false: a torso"
        " each (SB3's A2C; on CartPole it solved in 5.5k-99k env steps where the shared torso took 118k-186k)")
    activation: Literal["tanh", "relu"] = Field("tanh", description="MLP activation")

