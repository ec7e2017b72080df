"""The Nature CNN torso (Mnih et al. 2015): three convolutions and a 512-unit layer.

It takes uint8 frames ([batch, stack, height, width], as they travel and are
stored) and scales them to [0, 1] on whatever device it runs on: the float
copy exists only there.
"""

from __future__ import annotations

import math

import torch
from torch import nn

FEATURES = 512


def _orthogonal(layer: nn.Conv2d | nn.Linear, gain: float) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)  # type: ignore[arg-type]
    return layer


class NatureCNN(nn.Module):
    """uint8 [B, C, H, W] -> float [B, 512]; orthogonal init (gain sqrt 2) as CleanRL's and SB3's Atari agents."""

    def __init__(self, channels: int, height: int, width: int) -> None:
        super().__init__()
        gain = math.sqrt(2)
        self.convs = nn.Sequential(
            _orthogonal(nn.Conv2d(channels, 32, 8, stride=4), gain), nn.ReLU(),
            _orthogonal(nn.Conv2d(32, 64, 4, stride=2), gain), nn.ReLU(),
            _orthogonal(nn.Conv2d(64, 64, 3, stride=1), gain), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = int(self.convs(torch.zeros(1, channels, height, width)).shape[1])
        self.fc = nn.Sequential(_orthogonal(nn.Linear(flat, FEATURES), gain), nn.ReLU())
        self.features = FEATURES

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = frames.float() * (1.0 / 255.0) if frames.dtype == torch.uint8 else frames.float()
        return self.fc(self.convs(x))  # type: ignore[no-any-return]
