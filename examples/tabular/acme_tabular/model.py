"""The team's own model: a small residual MLP with LayerNorm for tabular rows (F,) -> class scores.

Fedge calls ``tabular_net(input_shape, num_outputs, options)`` with ``options`` = the session's [model.options].
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class TabularNet(nn.Module):
    def __init__(self, features: int, outputs: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Linear(features, hidden)
        self.block = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.classify = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.embed(x))
        return self.classify(h + self.block(h))


def tabular_net(input_shape: tuple[int, ...], num_outputs: int, options: dict[str, Any]) -> nn.Module:
    (features,) = input_shape
    return TabularNet(features, num_outputs, int(options.get("hidden", 32)))
