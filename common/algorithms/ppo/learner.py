"""The PPO learner: GAE over a batch of segments, then epochs x minibatches of clipped-surrogate
steps, each one :meth:`PPOLearner.compute_gradients` + :meth:`PPOLearner.apply_gradients`.

DPPO (barrier): the batch is exactly one round's segments, all acted with the current
weights, so behaviour and current policy agree at the first minibatch: plain PPO.

APPO (async): segments may come from a few versions back. With ``proximal_clip`` (the
default) the loss is decoupled PPO's (Hilton et al. 2022, "Batch size-invariance for policy
optimization"; IMPACT's target network): the surrogate's ratio is pi / pi_prox, pi_prox the
policy at the start of the learn call (log-probs computed by :meth:`PPOLearner.prepare`), so
the clip bounds this learn call's step as in on-policy PPO, and each row is weighted by
pi_prox / pi_behaviour truncated at ``behaviour_weight_max`` (V-trace's rho-bar), which
discounts what an older policy acted. The ratio to the behaviour policy instead (plain PPO
on stale data, ``proximal_clip: false``) centres the clip on a policy the learner has left:
rows already outside it push no further but nothing pulls the policy back, and evaluations
collapsed for 400-500k env steps on LunarLander. On fresh segments (DPPO) pi_prox is the
behaviour policy and both are plain PPO (up to rounding: weights of 1 - 1e-7). With ``vtrace``
advantages and value targets are V-trace's (lambda-returns whose deltas and traces weigh by the
same truncated ratio), so with the surrogate's weight a stale step counts the ratio squared, the
cautious choice measured in :func:`~rlfleet.common.algorithms.ppo.losses.gae`. Values are recomputed by the
current critic; staleness is bounded (``max_staleness`` versions, older segments dropped
before learn). ``behaviour_kl`` and ``behaviour_weight`` (figures of each learn call) say how
far the data lagged; with several learners, each rank's share.

Annealing (lr and clip, linear to 0) runs on the env steps of the segments trained on,
counted by the learner (the fleet's env steps in barrier mode).

On a GPU a batch goes to the device once (through the learner's staging buffers): values, GAE
(:func:`~rlfleet.common.algorithms.ppo.losses.gae_torch`, float32) and the epochs' rows stay there, and the
learn call's figures come back in one copy. On CPU the rows are tensors over the batch's arrays
and GAE is numpy's, in float64.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from rlfleet.common.algorithms.contract import DataSpec, Grads
from rlfleet.common.algorithms.device import cpu_copy
from rlfleet.common.algorithms.learning import LearnerBase
from rlfleet.common.algorithms.ppo.config import PPOConfig
from rlfleet.common.algorithms.ppo.losses import (
    behaviour_weights,
    clipped_surrogate,
    gae,
    gae_torch,
    normalize_advantage,
    normalize_chunks,
    value_loss,
)
from rlfleet.common.algorithms.ppo.networks import PPOCnnNetworks, RunningMeanStd, seeded_networks
from rlfleet.common.algorithms.schedules import linear

if TYPE_CHECKING:
    from rlfleet.common.algorithms.data_parallel import GradientAverager

SEGMENT_COLUMNS = ("obs", "action", "reward", "terminated", "truncated", "final_obs", "logp", "bootstrap_obs")
# logp: of the policy the ratio is taken to (pi_prox, or the behaviour's); weight: pi_prox / pi_behaviour, truncated
MINIBATCH_COLUMNS = ("obs", "action", "logp", "advantage", "return", "old_value", "weight")
FIGURES = ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")  # per minibatch, averaged


class PPOLearner(LearnerBase):
    """Actor and critic networks, one Adam, observation statistics. No sockets."""

    algorithm = "ppo"
    checkpoint_format = 3  # 2: actor and critic hidden layers stacked (TwinMLP); 3: the learner base's layout

    def __init__(self, cfg: PPOConfig, observation_space: gym.Space, action_space: gym.Space, *,
                 device: str | torch.device = "auto", seed: int = 0, averager: GradientAverager | None = None) -> None:
        super().__init__(cfg, DataSpec(table_kinds=PPOConfig.table_kinds, batch_items=cfg.batch_segments,
                                       returns_priorities=False, max_staleness=cfg.max_staleness, round="every_item",
                                       item_steps=cfg.segment_length), device, averager, cfg.max_grad_norm)
        self.net = seeded_networks(cfg, observation_space, action_space, seed).to(self.device)
        self.images = isinstance(self.net, PPOCnnNetworks)
        self._params = list(self.net.parameters())
        self.add_optimizer("policy", self._params, cfg.lr, cfg.adam_eps)
        assert observation_space.shape is not None
        self.obs_rms = RunningMeanStd(tuple(observation_space.shape), cfg.obs_clip) if cfg.obs_norm else None
        self.rng = np.random.default_rng([seed, 2])  # minibatch order
        self.env_steps = 0  # env steps in the segments trained on (drives annealing)
        self.progress_left = 1.0  # 1 - env_steps / anneal_env_steps, fixed for a learn call
        # GAE in torch on the device, or numpy's float64 on a CPU (where torch's per-step cost is 3-4x numpy's)
        self.gae_on_device = self.device.type != "cpu"
        self._behaviour: dict[str, torch.Tensor] = {}  # the last batch's distance from the policy that acted it

    # -- one batch of segments ----------------------------------------------

    def prepare(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Segments [S, T, ...] -> rows [S*T, ...] with GAE advantages and returns from the current critic.

        Updates the observation statistics first (with obs_norm) from the observations trained on.
        """
        missing = [key for key in SEGMENT_COLUMNS if key not in batch]
        if missing:
            raise KeyError(f"batch has no column(s) {missing}; PPO segments need {', '.join(SEGMENT_COLUMNS)}")
        obs = self._obs(batch["obs"])
        S, T = obs.shape[:2]
        shape = obs.shape[2:] if self.images else (-1,)  # images stay uint8 frames; the rest flat float32
        if self.obs_rms is not None:
            if self.averager is None:
                self.obs_rms.update(obs.reshape(S * T, -1))
            else:  # the statistics of every rank's observations: all ranks normalise alike
                self.obs_rms.update_sums(*self._group_sums(obs.reshape(S * T, -1)))
        action = np.asarray(batch["action"])
        flat_obs = obs.reshape(S * T, *shape)
        columns = {
            "obs": self._normalized(flat_obs),
            "action": action.reshape(S * T, *action.shape[2:]),
            "bootstrap_obs": self._normalized(self._obs(batch["bootstrap_obs"]).reshape(S, *shape)),
            "final_obs": self._normalized(self._obs(batch["final_obs"]).reshape(S * T, *shape)),
            "logp_behaviour": np.asarray(batch["logp"], np.float32).reshape(-1),
            "reward": np.asarray(batch["reward"]),
            "terminated": np.asarray(batch["terminated"], bool),
            "truncated": np.asarray(batch["truncated"], bool),
        }
        if "value" in batch:  # the values acted with: value_drift
            columns["acted_value"] = np.asarray(batch["value"], np.float32).reshape(-1)
        # on CPU the arrays' own memory (replay's frames are read-only: nothing here writes to them)
        b = self.staging.to_device(columns)
        with torch.no_grad():
            logp_prox, _, values = self.net.evaluate(b["obs"], b["action"])
            values = values.reshape(S, T)
            boot = self.net.value(b["bootstrap_obs"])
            final = self.net.value(b["final_obs"]).reshape(S, T)
        logp_behaviour = b["logp_behaviour"]
        if self.cfg.proximal_clip:
            logp = logp_prox.float()
            weight = behaviour_weights(logp, logp_behaviour, self.cfg.behaviour_weight_max)
        else:
            logp, weight = logp_behaviour, torch.ones_like(logp_behaviour)
        rho = weight.clamp(max=1.0).reshape(S, T) if self.cfg.proximal_clip and self.cfg.vtrace else None
        if not self.gae_on_device:
            advantage, returns, old_value = self._gae_on_host(b, values, boot, final, rho)
        else:  # float32, where the batch is: it never leaves the device
            next_values = torch.where(b["truncated"], final.float(),
                                      torch.cat([values[:, 1:].float(), boot.float()[:, None]], dim=1))
            advantage, returns = gae_torch(b["reward"], values.float(), next_values, b["terminated"],
                                           b["terminated"] | b["truncated"], self.cfg.gamma, self.cfg.gae_lambda, rho)
            advantage, returns, old_value = advantage.reshape(-1), returns.reshape(-1), values.float().reshape(-1)
        self._behaviour = {"behaviour_kl": (logp_behaviour - logp_prox).mean().float(),
                           "behaviour_weight": weight.mean().float()}
        if "acted_value" in b:
            self._behaviour["value_drift"] = (b["acted_value"] - old_value).abs().mean()
        return {"obs": b["obs"], "action": b["action"], "logp": logp, "weight": weight, "advantage": advantage,
                "return": returns, "old_value": old_value}

    def _gae_on_host(self, b: Mapping[str, torch.Tensor], values: torch.Tensor, boot: torch.Tensor,
                     final: torch.Tensor, rho: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:func:`gae` in float64 on CPU tensors: advantages, returns and the values, flat float32."""
        values64 = values.cpu().numpy().astype(np.float64)
        next_values = np.concatenate([values64[:, 1:], boot.cpu().numpy().astype(np.float64)[:, None]], axis=1)
        truncated, terminated = b["truncated"].cpu().numpy(), b["terminated"].cpu().numpy()
        next_values = np.where(truncated, final.cpu().numpy().astype(np.float64), next_values)
        advantages, returns = gae(b["reward"].cpu().numpy(), values64, next_values, terminated, terminated | truncated,
                                  self.cfg.gamma, self.cfg.gae_lambda, None if rho is None else rho.cpu().numpy())

        def flat(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(x.reshape(-1).astype(np.float32)).to(self.device)

        return flat(advantages), flat(returns), flat(values64)

    @property
    def behaviour(self) -> dict[str, float]:
        """The last batch's distance from the policy that acted it (and, where the batch has the values
        acted with, ``value_drift``)."""
        return {key: float(value) for key, value in self._behaviour.items()}

    def learn(self, batch: Mapping[str, Any], weights: Any = None) -> tuple[dict[str, float], None]:
        """GAE, then ``epochs`` passes over the batch in shuffled minibatches; returns mean figures."""
        cfg = self.cfg
        self.progress_left = linear(1.0, 0.0, self.env_steps, cfg.anneal_env_steps) if cfg.anneal_env_steps else 1.0
        rows = self.prepare(batch)
        n = len(rows["advantage"])
        # a round whose actor count changed at run time (compose --scale) may not split evenly: its last
        # minibatch is smaller (start-up refuses a configured fleet that does not split: check_fleet)
        totals = torch.zeros(len(FIGURES), device=self.device)  # summed on the device: no sync per step
        size = cfg.minibatch_size
        for _ in range(cfg.epochs):
            # one gather per epoch, then minibatches are slices; advantages normalised per minibatch
            order = self.staging.to_device({"order": self.rng.permutation(n)})["order"]
            epoch = {key: value[order] for key, value in rows.items()}
            if cfg.normalize_advantage:
                epoch["advantage"] = (normalize_chunks(epoch["advantage"], size) if self.averager is None
                                      else self._normalize_over_group(epoch["advantage"], size))
            for start in range(0, n, size):
                grads, step_figures = self._gradients(
                    {key: value[start:start + size] for key, value in epoch.items()}, normalized=True)
                self.apply_gradients(self.average(grads))  # data parallel: the mean over the group
                totals += step_figures
        steps = cfg.epochs * -(-n // cfg.minibatch_size)
        self.env_steps += n * self.world  # the global batch's
        # one device-to-host copy for every figure of the learn call
        names = (*FIGURES, *self._behaviour)
        values = torch.cat([totals / steps, torch.stack(list(self._behaviour.values())).to(totals)]).tolist()
        figures = dict(zip(names, values, strict=True))
        figures.setdefault("value_drift", 0.0)
        figures.update(lr=self.lr("policy"), clip_range=self._clip(), env_steps_trained=float(self.env_steps))
        return figures, None

    # -- one minibatch --------------------------------------------------------

    def compute_gradients(self, batch: Mapping[str, Any], weights: Any = None) -> tuple[Grads, dict[str, float], None]:
        """Gradients of the PPO loss on rows of :meth:`prepare` (obs already normalised).

        loss = clipped surrogate + vf_coef * value loss - ent_coef * entropy; grads {"policy": [...]}
        over actor, critic and log-std (one optimizer).
        """
        grads, figures = self._gradients(batch, normalized=False)
        return grads, dict(zip(FIGURES, figures.tolist(), strict=True)), None

    def _gradients(self, batch: Mapping[str, Any], normalized: bool) -> tuple[Grads, torch.Tensor]:
        """The gradients and the :data:`FIGURES` as one tensor (left on the device); ``normalized``:
        the advantages are normalised already."""
        cfg = self.cfg
        obs, action, old_logp, advantage, returns, old_value, weight = (
            torch.as_tensor(batch[key], device=self.device) for key in MINIBATCH_COLUMNS)
        logp, entropy, value = self.net.evaluate(obs, action)  # each network takes its own dtype
        log_ratio = logp - old_logp
        ratio = log_ratio.exp()
        if cfg.normalize_advantage and not normalized:
            advantage = normalize_advantage(advantage)
        clip = self._clip()
        policy_loss = clipped_surrogate(ratio, advantage, clip, weight)
        v_loss = value_loss(value, old_value, returns, cfg.clip_range_vf)
        entropy_mean = entropy.mean()
        loss = policy_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy_mean
        grads = list(torch.autograd.grad(loss, self._params, allow_unused=True))
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean()
            clip_fraction = ((ratio - 1).abs() > clip).float().mean()
            figures = torch.stack([loss, policy_loss, v_loss, entropy_mean, approx_kl, clip_fraction])
        return {"policy": grads}, figures

    def lr(self, optimizer: str) -> float:
        """The annealed learning rate."""
        return self.cfg.lr * (self.progress_left if self.cfg.anneal_lr else 1.0)

    def _clip(self) -> float:
        return self.cfg.clip_range * (self.progress_left if self.cfg.anneal_clip else 1.0)

    def _normalize_over_group(self, advantage: torch.Tensor, size: int) -> torch.Tensor:
        """:func:`normalize_chunks` with each minibatch's mean and std over every rank's share of it."""
        n = len(advantage)
        chunk = torch.arange(n, device=advantage.device) // size
        chunks = -(-n // size)
        a = advantage.double()
        count = torch.bincount(chunk, minlength=chunks).double()
        total = torch.zeros(chunks, dtype=torch.float64, device=a.device).index_add_(0, chunk, a)
        squares = torch.zeros(chunks, dtype=torch.float64, device=a.device).index_add_(0, chunk, a * a)
        self.group_sum([count, total, squares])
        mean = total / count
        std = ((squares - count * mean * mean).clamp(min=0) / (count - 1).clamp(min=1)).sqrt()
        normalized = ((a - mean[chunk]) / (std[chunk] + 1e-8)).to(advantage.dtype)
        return torch.where(count[chunk] >= 2, normalized, advantage)  # one row: its std is undefined

    def _group_sums(self, x: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """Count, sum and sum of squares of ``x``'s rows over every rank of the group."""
        x = np.asarray(x, np.float64)
        sums = [torch.tensor([float(len(x))], dtype=torch.float64), torch.from_numpy(x.sum(axis=0)),
                torch.from_numpy((x * x).sum(axis=0))]
        self.group_sum(sums)
        return float(sums[0][0]), sums[1].numpy(), sums[2].numpy()

    def _obs(self, column: Any) -> np.ndarray:
        """A batch's observations as the networks take them: uint8 frames as sent, anything else float32."""
        return np.asarray(column) if self.images else np.asarray(column, np.float32)

    def _normalized(self, obs: np.ndarray) -> np.ndarray:
        return obs if self.obs_rms is None else self.obs_rms.normalize(obs)

    # -- publishing and checkpoints ------------------------------------------

    def weights(self) -> dict[str, np.ndarray]:
        """Actor, critic (the policy's value extra), log-std; with obs_norm its statistics."""
        arrays = self.net.arrays()
        if self.obs_rms is not None:
            arrays.update(self.obs_rms.arrays())
        return arrays

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Actor, critic and log-std take them; with obs_norm the statistics too (the count as published)."""
        norm = {key: weights[key] for key in RunningMeanStd.KEYS if key in weights}
        rms = self.obs_rms
        if (rms is None) != (not norm) or (rms is not None and len(norm) != len(RunningMeanStd.KEYS)):
            raise ValueError(f"weights do not fit the learner: obs_norm is {'on' if rms else 'off'}, the weights "
                             f"hold {sorted(norm) or 'no statistics'}")
        if rms is not None:
            for key in ("obs_norm.mean", "obs_norm.var"):
                if np.shape(norm[key]) != rms.mean.shape:
                    raise ValueError(f"weights {key!r} have shape {np.shape(norm[key])}; need {rms.mean.shape}")
        self.net.load_arrays({key: value for key, value in weights.items() if key not in norm})
        if rms is not None:
            rms.mean = np.asarray(norm["obs_norm.mean"], np.float64).copy()
            rms.var = np.asarray(norm["obs_norm.var"], np.float64).copy()
            rms.count = float(np.asarray(norm["obs_norm.count"]).reshape(-1)[0])

    def resume_env_steps(self, env_steps: int) -> None:
        """Annealing runs on env steps: it goes on from the fleet's."""
        self.env_steps = max(self.env_steps, int(env_steps))

    def own_state(self) -> dict[str, Any]:
        rms = self.obs_rms
        return {
            "env_steps": self.env_steps,
            "net": cpu_copy(self.net.state_dict()),
            "obs_norm": None if rms is None else {"mean": torch.from_numpy(rms.mean.copy()),
                                                  "var": torch.from_numpy(rms.var.copy()), "count": rms.count},
            "rng": self.rng.bit_generator.state,
        }

    def load_own_state(self, state: Mapping[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.env_steps = int(state["env_steps"])
        if self.obs_rms is not None and state.get("obs_norm") is not None:
            self.obs_rms.mean = state["obs_norm"]["mean"].numpy().copy()
            self.obs_rms.var = state["obs_norm"]["var"].numpy().copy()
            self.obs_rms.count = float(state["obs_norm"]["count"])
        self.rng.bit_generator.state = state["rng"]
