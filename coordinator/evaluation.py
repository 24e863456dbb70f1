"""Evaluation of a global model on the held-out test set, on the coordinator.

Normalises the data set's official test split once, with the session's statistics, and scores named arrays with the
task's metrics (``algorithms.task``) by loading them into a local copy of the model. Knows nothing of sockets or
algorithms.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from fedge.algorithms.task import Metrics, evaluate_task, make_task
from fedge.fldata import normalize
from fedge.models import arrays_to_state, build

log = logging.getLogger("fedge.coordinator")


class GlobalEvaluator:
    """The task's metrics of arrays (a global model) on the whole official test set."""

    def __init__(self, plan: Any) -> None:
        dataset, config = plan.dataset, plan.config
        self.model = build(plan.spec)
        self.inputs = torch.from_numpy(normalize(dataset.test_x, plan.mean, plan.std))
        self.labels = torch.from_numpy(np.ascontiguousarray(dataset.test_y))
        self.task = make_task(config.train.loss, config.train.class_weights,
                              targets_are_classes=not dataset.has_targets)

    def __call__(self, arrays: dict[str, np.ndarray]) -> Metrics:
        arrays_to_state(self.model, arrays, strict=False)
        return evaluate_task(self.model, self.inputs, self.labels, self.task)
