"""THE local training loop: every algorithm's client half trains through this one function, via its hooks.

Holds the optimizer factory and ``train_local``. A fresh optimizer is created every round (no optimizer state is
carried between rounds, docs/algorithms.md section 0). The batch order is fixed by the seed the caller derives from
(run seed, round, client index), so a run is reproducible. A final batch of one sample is skipped when the model has
BatchNorm (training-mode BN cannot normalise a single sample). Must not know sockets, packets or the coordinator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedge.algorithms.base import LocalStats, TrainSettings
from fedge.algorithms.task import Task, make_task


class TrainingHooks(Protocol):
    """The client half's hooks the loop calls (``algorithms.contract.ClientHalf``; ``BaseClient`` gives each a no-op).
    ``before_training`` is called once before the first step (SCAFFOLD's Option I gradient at the received model,
    fedcos's learning rate)."""

    def before_training(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                        settings: TrainSettings) -> None: ...
    def extra_loss(self, model: nn.Module) -> torch.Tensor | None: ...
    def after_backward(self, model: nn.Module) -> None: ...
    def after_step(self, model: nn.Module) -> None: ...


def make_optimizer(params: list[torch.nn.Parameter], settings: TrainSettings) -> torch.optim.Optimizer:
    if settings.optimizer == "sgd":
        return torch.optim.SGD(params, lr=settings.lr, momentum=settings.momentum,
                               weight_decay=settings.weight_decay)
    if settings.optimizer == "adam":
        return torch.optim.Adam(params, lr=settings.lr, weight_decay=settings.weight_decay)
    return torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)


def has_batch_norm(model: nn.Module) -> bool:
    return any(isinstance(m, _BatchNorm) for m in model.modules())


class TrainingCancelled(Exception):
    """Local training was asked to stop between two steps (the agent is shutting down)."""


def task_of(settings: TrainSettings, labels: torch.Tensor) -> Task:
    """The task ``settings.loss`` names, for labels of this dtype."""
    return make_task(settings.loss, settings.class_weights, targets_are_classes=labels.dtype == torch.int64)


def train_local(model: nn.Module, hooks: TrainingHooks, inputs: torch.Tensor, labels: torch.Tensor,
                settings: TrainSettings, seed: int, cancelled: Callable[[], bool] | None = None,
                task: Task | None = None, spent: Callable[[int], bool] | None = None) -> LocalStats:
    """Run ``settings.epochs`` epochs of minibatch training with the hooks; return what was done. ``cancelled`` is
    polled between steps: when it returns True, ``TrainingCancelled`` is raised. ``spent(steps)``, polled before
    each step, ends training early when it returns True (a device's work budget): the round's update is then that
    of the steps taken, and ``LocalStats.steps`` says how many. The loss is ``task``'s (default: the one
    ``settings.loss`` names)."""
    task = task or task_of(settings, labels)
    hooks.before_training(model, inputs, labels, settings)
    model.train()
    generator = torch.Generator().manual_seed(seed)
    optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], settings)
    minimum_batch = 2 if has_batch_norm(model) else 1
    count = int(labels.shape[0])
    steps, samples, loss_sum, sizes = 0, 0, 0.0, []
    for _ in range(settings.epochs):
        order = torch.randperm(count, generator=generator)
        for start in range(0, count, settings.batch_size):
            batch = order[start:start + settings.batch_size]
            if batch.numel() < minimum_batch:
                continue
            if spent is not None and steps and spent(steps):
                break
            if cancelled is not None and cancelled():
                raise TrainingCancelled(f"stopped after {steps} steps")
            optimizer.zero_grad(set_to_none=False)
            loss = task.loss(model(inputs[batch]), labels[batch])
            extra = hooks.extra_loss(model)
            total = loss if extra is None else loss + extra
            total.backward()
            hooks.after_backward(model)
            optimizer.step()
            hooks.after_step(model)
            steps += 1
            sizes.append(int(batch.numel()))
            samples += int(batch.numel())
            loss_sum += float(loss.detach()) * int(batch.numel())
        else:
            continue
        break  # the budget is spent: no further epoch
    return LocalStats(steps=steps, samples=samples, loss=loss_sum / max(samples, 1), lr=settings.lr,
                      batch_sizes=tuple(sizes))


@torch.no_grad()
def evaluate(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
             batch_size: int = 500) -> tuple[float, float]:
    """Accuracy (a fraction) and mean cross-entropy of the model on a labelled set, in eval mode."""
    model.eval()
    correct, loss_sum, count = 0, 0.0, int(labels.shape[0])
    if count == 0:
        return float("nan"), float("nan")
    for start in range(0, count, batch_size):
        logits = model(inputs[start:start + batch_size])
        target = labels[start:start + batch_size]
        loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(1) == target).sum())
    return correct / count, loss_sum / count


def round_seed(run_seed: int, round_number: int, client_index: int) -> int:
    """The batch-order seed of one client in one round: a pure function, so a resumed run replays it exactly."""
    return (run_seed * 1_000_003 + round_number * 10_007 + client_index) % (2**63 - 1)


def attempt_seed(run_seed: int, attempt: int) -> int:
    """The run seed a client's ``attempt``-th task on one model version trains with, in an asynchronous session
    (0: the run's own, so that its first task on version v has round v + 1's batch order): two tasks of one client on
    one version do not repeat one batch order."""
    return run_seed if attempt == 0 else run_seed + attempt * 7919
