"""One Adam step on gradients handed over as a list: clip by global norm, step, no ``.grad``.

Learners get their gradients from ``compute_gradients`` (``torch.autograd.grad``), so
they have them as a list already. :class:`ClippedAdam` steps a ``torch.optim.Adam``'s own
state (``exp_avg``, ``exp_avg_sq``, ``step``: its ``state_dict`` is what checkpoints hold)
through the functional ``torch.optim.adam.adam``, skipping what ``Optimizer.step`` adds
per call (hooks, re-collecting the parameters that have a ``.grad``, profiling labels):
on the 64-row minibatches of PPO that bookkeeping costs as much as the update itself.

Clipping as ``clip_grad_norm_`` (scale by max_norm / (norm + 1e-6) when above) without a
pass over the gradients: the fused kernel divides them by ``grad_scale`` as it reads them.
Without CUDA or fused support (a device torch has no fused Adam for), the foreach
implementation runs with the gradients scaled first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch.optim import adam


class ClippedAdam:
    """``torch.optim.Adam`` (``self.optimizer``, for checkpoints) stepped from a list of gradients."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8,
                 betas: tuple[float, float] = (0.9, 0.999)) -> None:
        self.params: list[torch.Tensor] = list(params)
        self.fused = all(p.device.type in ("cpu", "cuda") for p in self.params)
        self.optimizer = torch.optim.Adam(self.params, lr=lr, eps=eps, betas=betas, fused=self.fused or None)

    def ensure_state(self) -> None:
        """Create the moments and step counts now (zeros, as Adam on its first step) if missing."""
        self._state()

    def _state(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """exp_avg, exp_avg_sq and step of every parameter, created as Adam would on its first step."""
        state = self.optimizer.state
        for p in self.params:
            if not state[p]:
                step_device = p.device if self.fused else torch.device("cpu")
                state[p].update(step=torch.zeros((), dtype=torch.float32, device=step_device),
                                exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                                exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format))
        return ([state[p]["exp_avg"] for p in self.params], [state[p]["exp_avg_sq"] for p in self.params],
                [state[p]["step"] for p in self.params])

    def step(self, grads: Sequence[torch.Tensor | None], max_grad_norm: float | None = None,
             lr: float | None = None) -> torch.Tensor | None:
        """Clip ``grads`` (one per parameter, None = zero) to ``max_grad_norm``, one Adam step at ``lr``.

        Returns the global gradient norm before clipping (a device tensor; None without clipping).
        """
        with torch.no_grad():
            grads_ = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, self.params, strict=True)]
            group = self.optimizer.param_groups[0]
            if lr is not None:
                group["lr"] = lr
            norm = scale = None
            if max_grad_norm is not None:
                norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads_)))
                scale = ((norm + 1e-6) / max_grad_norm).clamp_(min=1.0)  # divides the gradients
                if not self.fused:
                    torch._foreach_div_(grads_, scale)
                    scale = None
            exp_avgs, exp_avg_sqs, steps = self._state()
            beta1, beta2 = group["betas"]
            adam.adam(self.params, grads_, exp_avgs, exp_avg_sqs, [], steps, fused=self.fused,
                      foreach=None if self.fused else True, grad_scale=scale, found_inf=None,
                      amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                      weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
            return norm
