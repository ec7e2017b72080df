"""The ``algorithm:`` section for PPO. Imports only pydantic and common.config.sections:
the config is read where torch is not installed.

Defaults are rl-baselines3-zoo's PPO for LunarLander-v3 (n_steps 1024, batch 64,
4 epochs, gae_lambda 0.98, gamma 0.999, ent_coef 0.01) with SB3's policy
(separate 64x64 tanh actor and critic, lr 3e-4, clip 0.2, vf_coef 0.5, max grad norm 0.5).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from rlfleet.common.config.sections import AlgorithmSettings, NonNegFloat, PosFloat, PosInt

Fraction = Annotated[float, Field(gt=0, le=1)]


class PPOConfig(AlgorithmSettings):
    """PPO: DPPO on the barrier (each round's segments once), APPO async (decoupled clip, weighted by staleness)."""

    table_kinds: ClassVar[tuple[str, ...]] = ("queue",)
    # global batch sizes: with several learners each takes 1/learners of them
    per_rank_fields: ClassVar[tuple[str, ...]] = ("batch_segments", "minibatch_size")

    name: Literal["ppo"] = "ppo"
    segment_length: PosInt = Field(
        1024, description="T: env steps per trajectory segment, per env slot (SB3's n_steps)"
    )
    batch_segments: PosInt = Field(
        16, description="async: segments per learn call (batch = batch_segments * segment_length steps, which must"
        " split into minibatches). barrier: unused, a round's batch is every segment of the round"
        " (num_actors * num_envs * segment_length steps), checked against minibatch_size when the round starts"
    )
    minibatch_size: PosInt = Field(64, description="steps per gradient step")
    epochs: PosInt = Field(4, description="passes over each batch")
    gamma: Annotated[float, Field(gt=0, le=1)] = Field(0.999, description="discount")
    gae_lambda: Annotated[float, Field(ge=0, le=1)] = Field(0.98, description="GAE lambda")
    clip_range: Fraction = Field(0.2, description="surrogate clip: ratio kept within 1 +- clip_range")
    clip_range_vf: PosFloat | None = Field(
        None, description="value clip around the values before the update; null: no value clipping"
    )
    proximal_clip: bool = Field(
        True, description="the surrogate's ratio is pi / pi_prox, pi_prox the policy at the start of the learn call,"
        " and each row is weighted by pi_prox / pi_behaviour truncated at behaviour_weight_max (decoupled PPO,"
        " Hilton et al. 2022; IMPACT's target policy): the clip bounds this learn call's step whatever the"
        " segments' staleness. false: ratio pi / pi_behaviour (plain PPO; the same on fresh segments)")
    behaviour_weight_max: PosFloat = Field(
        1.0, description="with proximal_clip: the truncation of pi_prox / pi_behaviour (V-trace's rho-bar)")
    vtrace: bool = Field(
        True, description="with proximal_clip: advantages and value targets are V-trace's (GAE's deltas and traces"
        " weighted by the same truncated pi_prox / pi_behaviour): of the learn call's policy, not of the"
        " one that acted. Fresh segments: plain GAE")
    ent_coef: NonNegFloat = Field(0.01, description="entropy bonus weight")
    vf_coef: NonNegFloat = Field(0.5, description="value loss weight")
    max_grad_norm: PosFloat | None = Field(0.5, description="global gradient-norm clip; null disables")
    lr: PosFloat = Field(3e-4, description="Adam learning rate")
    adam_eps: PosFloat = Field(1e-5, description="Adam epsilon")
    anneal_lr: bool = Field(False, description="lr falls linearly to 0 over anneal_env_steps")
    anneal_clip: bool = Field(False, description="clip_range falls linearly to 0 over anneal_env_steps")
    anneal_env_steps: PosInt | None = Field(
        None, description="env steps over which annealing runs: counted in the segments the learner has trained"
        " on (in barrier mode the fleet's env steps; async: not counting dropped segments)"
    )
    normalize_advantage: bool = Field(True, description="advantages to zero mean, unit std per minibatch")
    obs_norm: bool = Field(
        False, description="normalise observations by running mean/var (clipped to +-obs_clip); the learner"
        " updates the statistics from what it trains on and publishes them with the weights"
    )
    obs_clip: PosFloat = Field(10.0, description="normalised observations are clipped to +- this")
    torso: Literal["auto", "mlp", "nature_cnn"] = Field(
        "auto", description="auto: one Nature CNN shared by actor and critic heads for image observations (uint8"
        " [stack, h, w]), else separate actor and critic MLPs")
    hidden: list[PosInt] = Field(default_factory=lambda: [64, 64], description="actor and critic MLP widths")
    activation: Literal["tanh", "relu"] = Field("tanh", description="MLP activation")
    log_std_init: float = Field(0.0, description="continuous actions: initial log std of the Gaussian")
    max_staleness: Annotated[int, Field(ge=0)] | None = Field(
        4, description="async: segments acted with weights more than this many versions old are dropped"
        " (counted) before learning; null: no limit. barrier: every segment is of the round's version"
    )

    @model_validator(mode="after")
    def _consistent(self) -> PPOConfig:
        problems = []
        if (self.anneal_lr or self.anneal_clip) and self.anneal_env_steps is None:
            problems.append("anneal_env_steps=None with anneal_lr or anneal_clip; allowed: env steps >= 1")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def check_fleet(self, sync: str, actors: int, num_envs: int, steps_per_round: int) -> list[str]:
        """Problems of this section with a fleet of ``actors`` actors of ``num_envs`` envs (start-up).

        Barrier: a round is ``actor.steps_per_round`` vector steps, a whole number of segments per env
        slot, and the round's segments must split into minibatches. Async: ``batch_segments`` must.
        """
        if sync == "barrier":
            if steps_per_round % self.segment_length:
                return [f"actor.steps_per_round={steps_per_round} is not a multiple of algorithm.segment_length="
                        f"{self.segment_length}: a barrier round must end on segment boundaries; allowed:"
                        f" {self.segment_length}, {2 * self.segment_length}, ..."]
            what = (f"a barrier round of actor.count * env.num_envs * actor.steps_per_round = {actors} * {num_envs}"
                    f" * {steps_per_round}")
            steps = actors * num_envs * steps_per_round
        else:
            what = f"the async batch of batch_segments * segment_length = {self.batch_segments} * {self.segment_length}"
            steps = self.batch_segments * self.segment_length
        if steps % self.minibatch_size == 0:
            return []
        return [f"algorithm.minibatch_size={self.minibatch_size} does not divide {what} = {steps} steps;"
                " allowed: a divisor of it"]
