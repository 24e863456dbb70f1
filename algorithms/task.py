"""The learning task: the training loss and the evaluation metrics, chosen by ``train.loss``.

``cross_entropy`` (the default; optional class weights) takes int64 classes and reports accuracy and macro F1;
``mse`` takes float32 targets of the output's shape and reports MSE and MAE; ``bce`` is BCE-with-logits on float32
{0, 1} targets of shape (K,) and reports exact-match and per-label accuracy. A plugin loss (``package.module:callable``
or an entry point of ``fedge.losses``) is called as ``loss(outputs, targets)`` and must return a scalar tensor; its
metrics are those of the targets' kind (classes: accuracy and F1; float targets of the output's shape: MSE and MAE).
Every metric is in ``METRIC_NAMES``; one that does not apply is None. Whether a device may import a plugin loss is
decided before ``make_task`` (``fedge.plugins.check_allowed``). Must not know sockets, packets or the coordinator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedge.plugins import PluginError, describe, load

BUILTIN_LOSSES = ("cross_entropy", "mse", "bce")
METRIC_NAMES = ("loss", "accuracy", "f1_macro", "exact_match", "label_accuracy", "mse", "mae")
Metrics = dict[str, float | None]


@dataclass(frozen=True)
class Task:
    """A loss and the metrics that go with it. ``kind``: classification | regression | multilabel."""

    name: str
    kind: str
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(outputs, targets)

    def check(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """A one-line ValueError when a batch of model outputs does not fit the targets under this loss."""
        if self.kind == "classification":
            if targets.dtype != torch.int64:
                raise ValueError(f"train.loss = {self.name} takes int64 class labels; the data has "
                                 f"{str(targets.dtype).removeprefix('torch.')} targets")
            if outputs.dim() != 2:
                raise ValueError(f"a classifier must output (batch, classes); the model outputs {tuple(outputs.shape)}")
            top = int(targets.max()) if targets.numel() else -1
            if top >= outputs.shape[1]:
                raise ValueError(f"the model outputs {outputs.shape[1]} scores per sample but the data has class "
                                 f"{top}")
        elif targets.dtype != torch.float32 or tuple(outputs.shape) != tuple(targets.shape):
            raise ValueError(f"train.loss = {self.name} takes float32 targets of the output's shape; the model "
                             f"outputs {tuple(outputs.shape)} and the data has "
                             f"{str(targets.dtype).removeprefix('torch.')} {tuple(targets.shape)}")
        try:
            value = self.loss(outputs, targets)
        except Exception as exc:
            raise ValueError(f"train.loss = {self.name} fails on one batch: {type(exc).__name__}: {exc}") from None
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ValueError(f"train.loss = {self.name} must return a scalar tensor, got {type(value).__name__}")

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> Metrics:
        """Every metric in METRIC_NAMES for the whole evaluation set (None where it does not apply)."""
        found: Metrics = dict.fromkeys(METRIC_NAMES)
        count = int(targets.shape[0])
        if count == 0:
            return found
        found["loss"] = float(self.loss(outputs, targets))
        if self.kind == "classification":
            predicted = outputs.argmax(1)
            found["accuracy"] = float((predicted == targets).double().mean())
            found["f1_macro"] = macro_f1(predicted, targets, outputs.shape[1])
        elif self.kind == "multilabel":
            hits = (outputs > 0) == (targets > 0.5)
            found["exact_match"] = float(hits.all(dim=1).double().mean())
            found["label_accuracy"] = float(hits.double().mean())
        else:
            error = (outputs - targets).double()
            found["mse"] = float((error ** 2).mean())
            found["mae"] = float(error.abs().mean())
        return found


def macro_f1(predicted: torch.Tensor, targets: torch.Tensor, classes: int) -> float:
    """The mean over classes present in targets or predictions of 2TP / (2TP + FP + FN)."""
    scores = []
    for c in range(classes):
        tp = int(((predicted == c) & (targets == c)).sum())
        fp = int(((predicted == c) & (targets != c)).sum())
        fn = int(((predicted != c) & (targets == c)).sum())
        if tp + fp + fn:
            scores.append(2 * tp / (2 * tp + fp + fn))
    return float(sum(scores) / len(scores)) if scores else 0.0


def make_task(loss: str = "cross_entropy", class_weights: Sequence[float] = (),
              targets_are_classes: bool = True) -> Task:
    """The task ``train.loss`` names. ``targets_are_classes`` picks a plugin loss's metrics."""
    if class_weights and loss != "cross_entropy":
        raise ValueError("train.class_weights applies to train.loss = cross_entropy only")
    if loss == "cross_entropy":
        weight = torch.tensor([float(w) for w in class_weights], dtype=torch.float32) if class_weights else None
        if weight is not None and (not torch.isfinite(weight).all() or bool((weight < 0).any())):
            raise ValueError("train.class_weights must be finite numbers >= 0")

        def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            w = None if weight is None else weight.to(outputs.device)
            if w is not None and w.numel() != outputs.shape[1]:
                raise ValueError(f"train.class_weights has {w.numel()} values for {outputs.shape[1]} classes")
            return F.cross_entropy(outputs, targets, weight=w)

        return Task(loss, "classification", cross_entropy)
    if loss == "mse":
        return Task(loss, "regression", F.mse_loss)
    if loss == "bce":
        return Task(loss, "multilabel", F.binary_cross_entropy_with_logits)
    try:
        fn = load(describe("loss", loss))
    except PluginError as exc:
        raise ValueError(f"train.loss must be one of {', '.join(BUILTIN_LOSSES)} or a plugin: {exc}") from None
    return Task(loss, "classification" if targets_are_classes else "regression", fn)


@torch.no_grad()
def evaluate_task(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, task: Task,
                  batch_size: int = 500) -> Metrics:
    """The task's metrics of the model on a labelled set, in eval mode (outputs gathered, then scored once)."""
    model.eval()
    if int(targets.shape[0]) == 0:
        return dict.fromkeys(METRIC_NAMES)
    outputs = torch.cat([model(inputs[start:start + batch_size]) for start in range(0, len(targets), batch_size)])
    return task.metrics(outputs, targets)
