"""Evaluation of a global model on the held-out test set, on the coordinator.

Loads the dataset's official test split once, normalises it and evaluates named arrays by loading them into a local
copy of the model. Knows nothing of sockets or algorithms.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from fedge.algorithms.loop import evaluate
from fedge.fldata import Dataset, normalize
from fedge.models import ModelSpec, arrays_to_state, build

log = logging.getLogger("fedge.coordinator")


class GlobalEvaluator:
    """Accuracy and loss of arrays (a global model) on the whole official test set."""

    def __init__(self, spec: ModelSpec, dataset: Dataset) -> None:
        self.model = build(spec)
        self.inputs = torch.from_numpy(normalize(dataset.test_x, dataset.mean, dataset.std))
        self.labels = torch.from_numpy(dataset.test_y.astype(np.int64))

    def __call__(self, arrays: dict[str, np.ndarray]) -> tuple[float, float]:
        arrays_to_state(self.model, arrays, strict=False)
        return evaluate(self.model, self.inputs, self.labels)
