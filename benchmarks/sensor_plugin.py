"""A team's own 1-D CNN for sensor windows, as a plugin module (not built from Fedge's models), and a synthetic
accelerometer set to train it on. Used by benchmarks/byom_bytes.py; imported by path
(``benchmarks.sensor_plugin:activity_cnn``) like any user's plugin.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn


class ActivityCNN(nn.Module):
    """conv(C->w, 7) -> BN -> ReLU -> pool -> conv(w->2w, 5) -> BN -> ReLU -> global pool -> FC 2w -> FC out."""

    def __init__(self, channels: int, outputs: int, width: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(channels, width, 7, padding=3), nn.BatchNorm1d(width), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(width, 2 * width, 5, padding=2), nn.BatchNorm1d(2 * width), nn.ReLU(),
            nn.Conv1d(2 * width, 2 * width, 5, padding=2), nn.BatchNorm1d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.classifier = nn.Sequential(nn.Linear(2 * width, 2 * width), nn.ReLU(), nn.Linear(2 * width, outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def activity_cnn(input_shape: tuple[int, ...], num_outputs: int, options: dict[str, Any]) -> nn.Module:
    channels, _ = input_shape
    return ActivityCNN(channels, num_outputs, int(options.get("width", 32)))


def activity_windows(count: int = 12_000, channels: int = 6, length: int = 64, classes: int = 6,
                     seed: int = 0) -> dict[str, Any]:
    """Synthetic 3-axis accelerometer + gyroscope windows: each activity has its own mix of frequencies per axis,
    with random phase, amplitude jitter, drift and noise, so that a small CNN has something to learn."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=count)
    base = np.random.default_rng(1234).uniform(0.5, 4.0, size=(classes, channels))  # cycles per window
    t = np.arange(length, dtype=np.float64) / length
    phase = rng.uniform(0, 2 * np.pi, size=(count, channels, 1))
    amplitude = rng.uniform(0.6, 1.4, size=(count, channels, 1))
    freq = base[labels][:, :, None] * rng.uniform(0.85, 1.15, size=(count, 1, 1))
    x = amplitude * np.sin(2 * np.pi * freq * t + phase)
    x += rng.normal(0, 0.5, size=(count, channels, 1)) * t + rng.normal(0, 0.6, size=x.shape)
    split = count * 5 // 6
    return {"train_x": x[:split].astype(np.float32), "train_y": labels[:split].astype(np.int64),
            "test_x": x[split:].astype(np.float32), "test_y": labels[split:].astype(np.int64),
            "num_classes": classes}
