"""One Adam step on gradients handed over as a list: clip by global norm, step, no ``.grad``.

Learners get their gradients from ``compute_gradients`` (``torch.autograd.grad``), so
they have them as a list already. :class:`ClippedAdam` steps Adam's state (``exp_avg``,
``exp_avg_sq``, ``step``, kept in ``torch.optim.Adam``'s ``state_dict`` layout: what checkpoints
hold) through the functional ``torch.optim.adam.adam``, skipping what ``Optimizer.step`` adds
per call (hooks, re-collecting the parameters that have a ``.grad``, profiling labels):
on the 64-row minibatches of PPO that bookkeeping costs as much as the update itself.

Clipping as ``clip_grad_norm_`` (scale by max_norm / (norm + 1e-6) when above) without a
pass over the gradients: the fused kernel divides them by ``grad_scale`` as it reads them.
Without CUDA or fused support (a device torch has no fused Adam for), the foreach
implementation runs with the gradients scaled first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.optim import adam


class ClippedAdam:
    """Adam stepped from a list of gradients; its ``state_dict`` is ``torch.optim.Adam``'s (either loads the other).

    The state is held here rather than in a ``torch.optim.Adam``: building one imports ``torch._dynamo``
    (its ``add_param_group`` is wrapped to disable it), ~0.9 s of a learner's start-up (2 CPU cores).
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8,
                 betas: tuple[float, float] = (0.9, 0.999), weight_decay: float = 0.0) -> None:
        self.params: list[torch.Tensor] = list(params)
        self.fused = all(p.device.type in ("cpu", "cuda") for p in self.params)
        # the keys torch.optim.Adam's param groups carry, so that a plain Adam loads this state_dict
        self.param_groups: list[dict[str, Any]] = [dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=False, maximize=False, foreach=None,
            capturable=False, differentiable=False, fused=self.fused or None, decoupled_weight_decay=False)]
        self.state: list[dict[str, torch.Tensor]] = [{} for _ in self.params]

    def ensure_state(self) -> None:
        """Create the moments and step counts now (zeros, as Adam on its first step) if missing."""
        self._state()

    def _state(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """exp_avg, exp_avg_sq and step of every parameter, created as Adam would on its first step."""
        for p, state in zip(self.params, self.state, strict=True):
            if not state:
                state.update(step=torch.zeros((), dtype=torch.float32, device=self._step_device(p)),
                             exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                             exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format))
        return ([s["exp_avg"] for s in self.state], [s["exp_avg_sq"] for s in self.state],
                [s["step"] for s in self.state])

    def _step_device(self, p: torch.Tensor) -> torch.device:
        return p.device if self.fused else torch.device("cpu")

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim.Adam.state_dict()``'s layout: parameters by index, tensors by reference."""
        return {"state": {i: dict(s) for i, s in enumerate(self.state) if s},
                "param_groups": [{**g, "params": list(range(len(self.params)))} for g in self.param_groups]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict`` of this class or of a ``torch.optim.Adam`` over the same parameters."""
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            sizes = [len(g["params"]) for g in groups]
            raise ValueError(f"optimizer state has param groups of {sizes} parameters; this one has "
                             f"one group of {len(self.params)}")
        saved = state_dict["state"]
        for i, (p, state) in enumerate(zip(self.params, self.state, strict=True)):
            index = groups[0]["params"][i]
            state.clear()
            if index in saved:
                s = saved[index]
                state.update(step=torch.as_tensor(s["step"], dtype=torch.float32).to(self._step_device(p)).clone(),
                             exp_avg=s["exp_avg"].to(p.device, p.dtype).clone(),
                             exp_avg_sq=s["exp_avg_sq"].to(p.device, p.dtype).clone())
        keep = {k: v for k, v in groups[0].items() if k in ("lr", "betas", "eps", "weight_decay")}
        self.param_groups[0].update(keep, betas=tuple(keep.get("betas", self.param_groups[0]["betas"])))

    def step(self, grads: Sequence[torch.Tensor | None], max_grad_norm: float | None = None,
             lr: float | None = None) -> torch.Tensor | None:
        """Clip ``grads`` (one per parameter; None: that parameter is not stepped, as ``torch.optim.Adam``
        skips a parameter without ``.grad``) to ``max_grad_norm``, one Adam step at ``lr``.

        Returns the global gradient norm before clipping (a device tensor; None without clipping).
        """
        with torch.no_grad():
            exp_avgs, exp_avg_sqs, steps = self._state()
            params, grads_ = self.params, [g for g in grads if g is not None]
            if len(grads) != len(params):
                raise ValueError(f"{len(grads)} gradients for {len(params)} parameters")
            if len(grads_) < len(params):
                keep = [i for i, g in enumerate(grads) if g is not None]
                params, exp_avgs, exp_avg_sqs, steps = ([xs[i] for i in keep]
                                                        for xs in (params, exp_avgs, exp_avg_sqs, steps))
            group = self.param_groups[0]
            if lr is not None:
                group["lr"] = lr
            norm = scale = None
            if not grads_:
                return None if max_grad_norm is None else torch.zeros((), device=self.params[0].device)
            if max_grad_norm is not None:
                norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads_)))
                scale = ((norm + 1e-6) / max_grad_norm).clamp_(min=1.0)  # divides the gradients
                if not self.fused:
                    torch._foreach_div_(grads_, scale)
                    scale = None
            beta1, beta2 = group["betas"]
            adam.adam(params, grads_, exp_avgs, exp_avg_sqs, [], steps, fused=self.fused,
                      foreach=None if self.fused else True, grad_scale=scale, found_inf=None,
                      amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                      weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
            return norm
