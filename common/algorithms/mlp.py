"""MLPs shared by the algorithms: :func:`mlp` (an ``nn.Sequential``), :class:`TwinMLP` (two MLPs
of the same widths over one input, trained as one: PPO's actor and critic, SAC's twin critics)
and the numpy acting path (:func:`numpy_layers`, :func:`numpy_mlp`): on the few rows an actor
acts on, numpy costs far less per call than torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np
import torch
from torch import nn

NumpyLayers = list[tuple[np.ndarray, np.ndarray]]
T = TypeVar("T")
ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def mlp(inputs: int, hidden: Sequence[int], outputs: int, activation: str,
        out_gain: float | None = None) -> nn.Sequential:
    """Linear layers of ``hidden`` widths with ``activation`` between them, then a linear head.

    ``out_gain`` given: orthogonal initialisation as SB3's and CleanRL's PPO (gain sqrt(2) on
    hidden layers, ``out_gain`` on the head, zero biases); None: PyTorch's default.
    """
    layers: list[nn.Module] = []
    width = inputs
    for size in hidden:
        linear = nn.Linear(width, size)
        if out_gain is not None:
            nn.init.orthogonal_(linear.weight, math.sqrt(2))
            nn.init.zeros_(linear.bias)
        layers += [linear, ACTIVATIONS[activation]()]
        width = size
    head = nn.Linear(width, outputs)
    if out_gain is not None:
        nn.init.orthogonal_(head.weight, out_gain)
        nn.init.zeros_(head.bias)
    return nn.Sequential(*layers, head)


def float32_head(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """An output layer ``x @ weight.T + bias``, in float32 even under bfloat16 autocast: hidden layers gain
    the speed, while a bfloat16 output would round a Q-value of ~100 to steps of 0.5."""
    if torch.is_autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):
            return torch.addmm(bias, x.float(), weight.t())
    return torch.addmm(bias, x, weight.t())


class TwinMLP(nn.Module):
    """Two MLPs of the same hidden widths over the same input: ``forward(x) -> (first(x), second(x))``.

    Hidden layer i is ``weight[i]`` [2, in, out] and ``bias[i]`` [2, 1, out] (index 0: first MLP,
    1: second); the heads are plain linears. Built from two ``nn.Sequential`` of :func:`mlp`,
    whose initialisation (and RNG use) it keeps.
    """

    def __init__(self, first: nn.Sequential, second: nn.Sequential, activation: str) -> None:
        super().__init__()
        pairs = [(a, b) for a, b in zip(first, second, strict=True)
                 if isinstance(a, nn.Linear) and isinstance(b, nn.Linear)]
        with torch.no_grad():
            self.weight = nn.ParameterList(
                [nn.Parameter(torch.stack([a.weight.t(), b.weight.t()]).contiguous()) for a, b in pairs[:-1]])
            self.bias = nn.ParameterList(
                [nn.Parameter(torch.stack([a.bias, b.bias]).unsqueeze(1).contiguous()) for a, b in pairs[:-1]])
        self.head_first, self.head_second = pairs[-1]
        # plain references for the forward passes: module calls and ParameterList iteration cost more
        # than the matmuls of a 64-row minibatch (``.to(device)`` keeps these Parameter objects)
        self._hidden: list[tuple[torch.Tensor, torch.Tensor]] = list(zip(self.weight, self.bias, strict=True))
        self._heads: tuple[tuple[torch.Tensor, torch.Tensor], ...] = (
            (self.head_first.weight, self.head_first.bias), (self.head_second.weight, self.head_second.bias))
        self._fn: Callable[[torch.Tensor], torch.Tensor] = torch.tanh if activation == "tanh" else torch.relu

    def forward(self, x: torch.Tensor, detached: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Both outputs. ``detached``: through detached parameters (gradients reach ``x``, not the
        parameters: SAC's actor loss goes through the critics without training them)."""
        (wa, ba), (wc, bc) = self._heads
        hidden = self._hidden
        if detached:
            wa, ba, wc, bc = wa.detach(), ba.detach(), wc.detach(), bc.detach()
            hidden = [(w.detach(), b.detach()) for w, b in hidden]
        if not hidden:
            return float32_head(x, wa, ba), float32_head(x, wc, bc)
        h = x.expand(2, *x.shape)
        for weight, bias in hidden:
            h = self._fn(torch.baddbmm(bias, h, weight))
        return float32_head(h[0], wa, ba), float32_head(h[1], wc, bc)

    def one(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Only the first (0) or the second (1) MLP's output."""
        h = x
        for weight, bias in self._hidden:
            h = self._fn(torch.addmm(bias[index], h, weight[index]))
        w, b = self._heads[index]
        return float32_head(h, w, b)

    def layers(self, index: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(weight [out, in], bias [out]) per linear of one MLP, as ``nn.Linear`` holds them."""
        head = self.head_first if index == 0 else self.head_second
        hidden = [(w[index].t(), b[index, 0]) for w, b in zip(self.weight, self.bias, strict=True)]
        return [*hidden, (head.weight, head.bias)]


def numpy_layers(arrays: Mapping[str, np.ndarray], prefix: str) -> NumpyLayers:
    """(W^T, b) float32 copies per linear of the MLP ``prefix`` in ``arrays`` (``prefix.{0,2,4..}.weight``
    [out, in] and ``.bias``, as an ``nn.Sequential`` of :func:`mlp` names them), for :func:`numpy_mlp`."""
    layers = []
    i = 0
    while f"{prefix}.{i}.weight" in arrays:
        layers.append((np.array(np.asarray(arrays[f"{prefix}.{i}.weight"]).T, np.float32, order="C"),
                       np.array(arrays[f"{prefix}.{i}.bias"], np.float32)))
        i += 2
    return layers


def numpy_mlp(layers: NumpyLayers, x: np.ndarray, activation: str) -> np.ndarray:
    """The MLP of :func:`mlp` in numpy: acting on a few rows costs far less than a torch call."""
    h = x
    for i, (w, b) in enumerate(layers):
        h = h @ w
        h += b
        if i < len(layers) - 1:
            if activation == "tanh":
                np.tanh(h, out=h)
            else:
                np.maximum(h, 0.0, out=h)
    return h


def seeded(seed: int, make: Callable[[], T]) -> T:
    """``make()`` (networks) with torch's RNG seeded by ``seed`` and put back after: a learner and a policy
    built with the same seed start from the same weights, and nobody else's random stream moves."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def twin_q(critic: TwinMLP, obs: torch.Tensor, action: torch.Tensor,
           detached: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Q1 and Q2 of a twin ``critic`` over (obs, action); ``detached``: gradients reach the action only."""
    q1, q2 = critic(torch.cat([obs.flatten(1), action], dim=1), detached)
    return q1.squeeze(1), q2.squeeze(1)
