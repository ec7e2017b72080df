"""GAE and the pieces of the PPO loss, as plain functions (checked by hand in the tests).

- :func:`gae`: generalised advantage estimation over segments [S, T] (V-trace's, given importance weights);
  :func:`gae_torch`: the same on tensors, on the learner's device (a GPU learner's batch never leaves it).
- :func:`clipped_surrogate`: -E[w min(r A, clip(r, 1-e, 1+e) A)] (w: behaviour weights, 1 on-policy).
- :func:`behaviour_weights`: min(pi_prox / pi_behaviour, rho_bar), decoupled PPO's off-policy correction.
- :func:`value_loss`: E[(V - R)^2], or with value clipping E[max((V - R)^2, (V_clip - R)^2)]
  with V_clip = V_old + clip(V - V_old, -c, c) (PPO2 / CleanRL).
- :func:`normalize_advantage`: zero mean, unit std (per minibatch); :func:`normalize_chunks`: of
  every minibatch of an epoch at once.
"""

from __future__ import annotations

import numpy as np
import torch


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    episode_end: np.ndarray,
    gamma: float,
    lam: float,
    rho: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns (advantage + value) of segments, all arrays [S, T].

    ``next_values[s, t]`` is V of the observation after step t (the next step's obs, the
    segment's bootstrap obs, or the final obs of a truncated episode); it is not used
    where ``terminated``. ``episode_end`` (terminated or truncated) stops the trace.

        delta_t = r_t + gamma * (1 - terminated_t) * V(next_t) - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - episode_end_t) * A_{t+1}

    ``rho`` (importance weights pi / mu truncated at 1, [S, T]): V-trace with lambda (Espeholt et al.
    2018), each delta and each trace weighed by rho,

        A_t = rho_t delta_t + gamma * lam * rho_t * (1 - episode_end_t) * A_{t+1},   returns = A + V,

    the returns V-trace's targets of the policy pi from steps acted by mu. The PPO learner takes these
    A_t as advantages too and its surrogate weighs each step by rho_t again, so a stale step counts
    rho_t^2 (IMPALA's policy gradient counts it once): the more cautious of the two, which solved
    LunarLander APPO on 10 of 10 seeds (two sittings of 5) where rho once solved 4 of 5. All ones: GAE.
    """
    rewards = np.asarray(rewards, np.float64)
    values = np.asarray(values, np.float64)
    delta = rewards + gamma * np.where(terminated, 0.0, next_values) - values
    carry = gamma * lam * (1.0 - np.asarray(episode_end, np.float64))
    if rho is not None:
        rho = np.asarray(rho, np.float64)
        delta, carry = rho * delta, carry * rho
    advantages = np.zeros_like(delta)
    last = np.zeros(delta.shape[0])
    for t in range(delta.shape[1] - 1, -1, -1):
        last = delta[:, t] + carry[:, t] * last
        advantages[:, t] = last
    return advantages, advantages + values


def gae_torch(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    episode_end: torch.Tensor,
    gamma: float,
    lam: float,
    rho: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gae` on tensors [S, T] (``terminated``, ``episode_end`` bool), in ``values``' dtype and on its
    device: one fused multiply-add per step of the segments, time-major so each step's row is contiguous."""
    dtype = values.dtype
    delta = rewards.to(dtype) + gamma * torch.where(terminated, 0.0, next_values.to(dtype)) - values
    carry = gamma * lam * (1.0 - episode_end.to(dtype))
    if rho is not None:
        rho = rho.to(dtype)
        delta, carry = rho * delta, carry * rho
    delta, carry = delta.T.contiguous(), carry.T.contiguous()
    advantages = torch.empty_like(delta)
    last = torch.zeros_like(delta[0])
    for t in range(delta.shape[0] - 1, -1, -1):
        last = torch.addcmul(delta[t], carry[t], last, out=advantages[t])
    advantages = advantages.T
    return advantages, advantages + values


def normalize_advantage(advantage: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit std; a single row is left as is (its std is undefined)."""
    if advantage.numel() < 2:
        return advantage
    return (advantage - advantage.mean()) / (advantage.std() + 1e-8)


def normalize_chunks(advantage: torch.Tensor, size: int) -> torch.Tensor:
    """:func:`normalize_advantage` of each run of ``size`` rows (the minibatches of an epoch), at once."""
    full = len(advantage) // size * size
    parts = []
    if full:
        chunks = advantage[:full].reshape(-1, size)
        if size < 2:
            parts.append(advantage[:full])
        else:
            parts.append(((chunks - chunks.mean(1, keepdim=True)) / (chunks.std(1, keepdim=True) + 1e-8)).reshape(-1))
    if full < len(advantage):
        parts.append(normalize_advantage(advantage[full:]))
    return torch.cat(parts) if len(parts) != 1 else parts[0]


def clipped_surrogate(ratio: torch.Tensor, advantage: torch.Tensor, clip: float,
                      weight: torch.Tensor | None = None) -> torch.Tensor:
    """The PPO policy loss: mean of max(-A r, -A clip(r, 1 - clip, 1 + clip)), each row times ``weight``."""
    loss = torch.max(-advantage * ratio, -advantage * ratio.clamp(1.0 - clip, 1.0 + clip))
    return (loss if weight is None else weight * loss).mean()


def behaviour_weights(logp_prox: torch.Tensor, logp_behaviour: torch.Tensor, rho_bar: float) -> torch.Tensor:
    """min(pi_prox / pi_behaviour, rho_bar) per row: how far the policy of the learn call (prox) has moved
    from the one that acted, truncated as V-trace's rho (decoupled PPO, Hilton et al. 2022)."""
    return (logp_prox - logp_behaviour).exp().clamp(max=rho_bar)


def value_loss(value: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor,
               clip: float | None) -> torch.Tensor:
    """Mean squared error to the returns, the pessimistic (max) of clipped and unclipped when ``clip``."""
    unclipped = (value - returns).pow(2)
    if clip is None:
        return unclipped.mean()
    clipped = old_value + (value - old_value).clamp(-clip, clip)
    return torch.max(unclipped, (clipped - returns).pow(2)).mean()
