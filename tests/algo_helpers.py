"""Small shared pieces for the algorithm tests: tiny models, synthetic client data, array comparisons."""

from __future__ import annotations

import numpy as np
import torch

from fedge.algorithms.loop import TrainSettings
from fedge.models import ModelSpec

TINY_MLP = ModelSpec(name="mlp", input_shape=(1, 6, 6), num_classes=4)
TINY_CNN = ModelSpec(name="cnn", input_shape=(1, 8, 8), num_classes=4)
TINY_CNN_BN = ModelSpec(name="cnn-bn", input_shape=(1, 8, 8), num_classes=4)
SGD = TrainSettings(epochs=1, batch_size=16, lr=0.05, optimizer="sgd")
ADAM = TrainSettings(epochs=1, batch_size=16, lr=1e-3, optimizer="adam")


def client_data(spec: ModelSpec, clients: int, samples: int = 48, seed: int = 0,
                shift: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Learnable synthetic data: labels depend on the inputs; clients differ when ``shift``."""
    generator = torch.Generator().manual_seed(seed)
    data = []
    for index in range(clients):
        x = torch.randn(samples, *spec.input_shape, generator=generator)
        if shift:
            x = x + 0.5 * index
        y = (x.flatten(1)[:, : spec.num_classes].argmax(1)).long()
        data.append((x, y))
    return data


def same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def max_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)
