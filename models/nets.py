"""The network definitions Fedge ships: the DSSA paper CNN (``cnn``), its BatchNorm variant (``cnn-bn``), an MLP.

Each hidden layer is conv/linear -> [BatchNorm] -> [position encoding] -> ReLU (-> max-pool for convs), so PANs sit
after BN and before the activation, on hidden layers only. Module names are stable (``conv1``, ``bn1``, ``fc1``...):
they are the tensor names on the wire. Knows nothing of algorithms, data loading or the wire format.
"""

from __future__ import annotations

import torch
from torch import nn

from fedge.models.pan import PanSpec, position_encoding


def _norm(kind: str, width: int, batch_norm: bool) -> nn.Module:
    if not batch_norm:
        return nn.Identity()
    return nn.BatchNorm2d(width) if kind == "conv" else nn.BatchNorm1d(width)


class PaperCNN(nn.Module):
    """conv3x3 C->32->64->128 (padding 1, ReLU, 2x2 max-pool each), flatten, FC 512, FC classes; biases everywhere."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, pan: PanSpec,
                 batch_norm: bool = False) -> None:
        super().__init__()
        channels, height, width = input_shape
        widths = (32, 64, 128)
        self.conv1 = nn.Conv2d(channels, widths[0], 3, padding=1)
        self.bn1 = _norm("conv", widths[0], batch_norm)
        self.pe1 = position_encoding(widths[0], pan)
        self.conv2 = nn.Conv2d(widths[0], widths[1], 3, padding=1)
        self.bn2 = _norm("conv", widths[1], batch_norm)
        self.pe2 = position_encoding(widths[1], pan)
        self.conv3 = nn.Conv2d(widths[1], widths[2], 3, padding=1)
        self.bn3 = _norm("conv", widths[2], batch_norm)
        self.pe3 = position_encoding(widths[2], pan)
        for _ in widths:
            height, width = height // 2, width // 2
        self.flat_features = widths[2] * height * width
        self.fc1 = nn.Linear(self.flat_features, 512)
        self.bn4 = _norm("fc", 512, batch_norm)
        self.pe4 = position_encoding(512, pan)
        self.fc2 = nn.Linear(512, num_classes)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.pe1(self.bn1(self.conv1(x)))))
        x = self.pool(torch.relu(self.pe2(self.bn2(self.conv2(x)))))
        x = self.pool(torch.relu(self.pe3(self.bn3(self.conv3(x)))))
        x = torch.flatten(x, 1)
        x = torch.relu(self.pe4(self.bn4(self.fc1(x))))
        return self.fc2(x)


class MLP(nn.Module):
    """flatten -> 200 -> 200 -> classes with ReLU."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, pan: PanSpec,
                 batch_norm: bool = False) -> None:
        super().__init__()
        features = input_shape[0] * input_shape[1] * input_shape[2]
        self.fc1 = nn.Linear(features, 200)
        self.bn1 = _norm("fc", 200, batch_norm)
        self.pe1 = position_encoding(200, pan)
        self.fc2 = nn.Linear(200, 200)
        self.bn2 = _norm("fc", 200, batch_norm)
        self.pe2 = position_encoding(200, pan)
        self.fc3 = nn.Linear(200, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        x = torch.relu(self.pe1(self.bn1(self.fc1(x))))
        x = torch.relu(self.pe2(self.bn2(self.fc2(x))))
        return self.fc3(x)
