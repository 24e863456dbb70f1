"""A user's own models, as a plugin package would define them: not built from Fedge's models.

``sensor_cnn`` is a 1-D CNN over (C, L) float32 sensor windows with a BatchNorm1d, a GroupNorm, a LayerNorm, nested
``nn.Sequential`` blocks with non-default names, a persistent non-BN buffer, Fedge's position-encoding layer (so it
can use PANs) and one Linear that opts out of pruning. ``sensor_regressor`` is the same body with a regression head.
``bad_output`` ignores ``num_outputs``; ``not_a_module`` returns something else; ``raises`` fails.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from fedge.models import PositionEncoding


class SensorNet(nn.Module):
    def __init__(self, channels: int, outputs: int, width: int) -> None:
        super().__init__()
        self.register_buffer("channel_gain", torch.linspace(0.5, 1.5, channels))
        self.body = nn.Sequential(OrderedDict(
            stem=nn.Conv1d(channels, width, 5, padding=2),
            norm=nn.BatchNorm1d(width),
            position=PositionEncoding(width),
            act=nn.ReLU(),
            mix=nn.Sequential(OrderedDict(
                conv=nn.Conv1d(width, width, 3, padding=1),
                group=nn.GroupNorm(2, width),
                act=nn.ReLU(),
            )),
            pool=nn.AdaptiveAvgPool1d(1),
            flat=nn.Flatten(),
        ))
        self.head = nn.Sequential(OrderedDict(
            layer=nn.LayerNorm(width),
            gate=nn.Linear(width, width),
            out=nn.Linear(width, outputs),
        ))
        self.head.gate.fedge_prunable = False  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain: torch.Tensor = self.channel_gain  # type: ignore[assignment]
        h = self.body(x * gain.view(1, -1, 1))
        h = self.head.layer(h)
        return self.head.out(torch.relu(self.head.gate(h)) + h)


def sensor_cnn(input_shape: tuple[int, ...], num_outputs: int, options: dict[str, Any]) -> nn.Module:
    channels, _length = input_shape
    return SensorNet(channels, num_outputs, int(options.get("width", 8)))


def sensor_regressor(input_shape: tuple[int, ...], num_outputs: int, options: dict[str, Any]) -> nn.Module:
    return sensor_cnn(input_shape, num_outputs, options)


def bad_output(input_shape: tuple[int, ...], num_outputs: int, options: dict[str, Any]) -> nn.Module:
    return SensorNet(input_shape[0], num_outputs + 1, 8)


def not_a_module(input_shape: tuple[int, ...], num_outputs: int, options: dict[str, Any]) -> object:
    return object()


def raises(input_shape: tuple[int, ...], num_outputs: int, options: dict[str, Any]) -> nn.Module:
    raise RuntimeError("the sensor model needs options.width")


def sum_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A plugin loss: mean absolute error."""
    return (outputs - targets).abs().mean()


def sensor_windows(count: int = 240, channels: int = 3, length: int = 32, classes: int = 3,
                   seed: int = 0) -> dict[str, Any]:
    """Synthetic accelerometer-like windows: each class is a sine of its own frequency plus noise, float32."""
    import numpy as np

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=count)
    t = np.arange(length, dtype=np.float64)
    phase = rng.uniform(0, 2 * np.pi, size=(count, channels, 1))
    freq = (1 + labels).reshape(-1, 1, 1) * 2 * np.pi / length
    x = 2.0 * np.sin(freq * t + phase) + 3.0 + 0.3 * rng.standard_normal((count, channels, length))
    split = count * 5 // 6
    return {"train_x": x[:split].astype(np.float32), "train_y": labels[:split].astype(np.int64),
            "test_x": x[split:].astype(np.float32), "test_y": labels[split:].astype(np.int64),
            "num_classes": classes}


def device_windows() -> dict[str, Any]:
    """A device's data callable (the agent calls it with no arguments)."""
    return sensor_windows(count=120, seed=3)


def tabular_mlp(input_shape: tuple[int, ...], num_outputs: int, options: dict[str, Any]) -> nn.Module:
    """A plain MLP without position encodings (so it cannot use PANs)."""
    features = 1
    for d in input_shape:
        features *= d
    return nn.Sequential(nn.Flatten(), nn.Linear(features, 16), nn.ReLU(), nn.Linear(16, num_outputs))


def broken_windows() -> dict[str, Any]:
    """A data callable that fails, as a sensor reader does when its bus is down."""
    raise OSError("no I2C device at 0x68")


def sensor_targets() -> dict[str, Any]:
    """A regression data set: two float targets per window (the mean of channel 0, the spread of channel 1)."""
    import numpy as np

    arrays = sensor_windows(count=120, seed=5)
    for part in ("train", "test"):
        x = arrays[f"{part}_x"]
        arrays[f"{part}_y"] = np.stack([x[:, 0].mean(1), x[:, 1].std(1)], axis=1).astype(np.float32)
    del arrays["num_classes"]
    return arrays
