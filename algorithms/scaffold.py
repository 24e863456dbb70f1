"""SCAFFOLD (Karimireddy et al. 2020; docs/algorithms.md section 3): FedAvg with control variates against client drift.

Server: x <- x + eta_g sum_i p_i dy_i and c <- c + (1/N) sum_i dc_i, with N = ``context.num_clients`` (all clients,
not the sampled ones). Client: trains from x with the correction (c - c_i), then c_i+ by Option II (default,
c_i - c + (x - y_i)/(K eta_l)) or Option I (the full local gradient at the received x), and uploads dy_i and dc_i.
Downlink groups "model" (x) and "control" (c); uplink groups "delta" (dy_i; integer buffers travel as values) and
"control" (dc_i). c_i is device state (``Client.state_dict``). Must not import a transport.

Decisions where the papers are silent (docs/algorithms.md records them too):
- Control variates exist for the float parameters only: every float tensor except BatchNorm running statistics.
  Float buffers are averaged like parameters (x + eta_g sum p_i dy_i); integer buffers take the clients' lower median.
- Aggregation weights p_i follow ``weighting`` (default "samples", as FedAvg, so that round 1 equals FedAvg's round
  for any client sizes; "uniform" is the paper's 1/|S_t|). Both agree on equal client sizes.
- ``correction = "update"`` (default, for every optimizer): y <- OptimizerStep(y) - eta_l (c - c_i) after each step
  (NIID-Bench). ``"gradient"`` adds (c - c_i) to the gradient before the step (FL-bench). With plain SGD (no
  momentum, no weight decay) the two give the same iterate up to float rounding; with Adam only "update" keeps
  Option II's c_i on the scale of the update direction.
- eta_l for the update-space correction: the learning rate ``before_training`` (called by the loop) passes; a
  driver that trains without the loop falls back to the lr of the client's own last round (device state), else to
  the lr the server last saw reported (downlink meta "lr"). c = c_i = 0 needs none.
- K = 0 steps (no data): c_i is left unchanged (dc_i = 0). Option I's full local gradient is taken in
  ``before_training``, in training mode, with every buffer (BatchNorm statistics) restored afterwards.
- ``freeze(masks)``: coordinates whose c_i must stay as they are this round (DSSA's retained weights, section 4.3).
- Arithmetic is done in float64 and cast back to each tensor's dtype, so a float64 toy model keeps its precision.
  The client stores c_i+ = c_i + dc_i, rounded exactly as the server rounds c + dc, so identical clients keep
  c_i == c bit for bit (whenever 1/N is exact) and their correction is exactly zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedge.algorithms import fedavg
from fedge.algorithms.accumulate import WeightedSum
from fedge.algorithms.base import (
    DELTA_GROUP,
    MODEL_GROUP,
    Arrays,
    ClientUpdate,
    LocalStats,
    ModelLayout,
    Payload,
    ServerContext,
    lacking,
    learned_floats,
    mistyped,
    model_arrays,
)
from fedge.algorithms.contract import BaseClient, BaseServer
from fedge.algorithms.loop import TrainSettings, task_of
from fedge.algorithms.task import Task, make_task
from fedge.codec import TensorGroup

OPTIONS = ("II", "I")
CORRECTIONS = ("update", "gradient")


@dataclass(frozen=True)
class Config:
    weighting: str = "samples"
    option: str = "II"
    correction: str = "update"
    global_lr: float = 1.0

    def __post_init__(self) -> None:
        if self.weighting not in ("samples", "uniform"):
            raise ValueError(f"algorithm.weighting must be 'samples' or 'uniform', got {self.weighting!r}")
        if self.option not in OPTIONS:
            raise ValueError(f"algorithm.option must be one of {OPTIONS}, got {self.option!r}")
        if self.correction not in CORRECTIONS:
            raise ValueError(f"algorithm.correction must be one of {CORRECTIONS}, got {self.correction!r}")
        if not self.global_lr > 0:
            raise ValueError(f"algorithm.global_lr must be > 0, got {self.global_lr}")


def control_names(layout: ModelLayout, initial: Arrays) -> list[str]:
    """The tensors that carry a control variate: float tensors that are not BatchNorm running statistics."""
    return learned_floats(layout, initial)


class Server(BaseServer):
    """Holds the global model x and the global control variate c."""

    def __init__(self, config: Config, initial: Arrays, context: ServerContext) -> None:
        self.config = config
        self.context = context
        self.model: Arrays = {name: array.copy() for name, array in initial.items()}
        self.control: Arrays = {name: np.zeros_like(initial[name])
                                for name in control_names(context.layout, initial)}
        self.lr: float | None = None
        self.folding: fedavg.Folding | None = None  # the round being folded (n_i * delta y_i)
        self.controls = WeightedSum()                 # ... and its delta c_i
        self.lr_from = -1                             # the client index the round's learning rate came from

    def downlink(self, round_number: int, client_index: int) -> Payload:
        meta = {} if self.lr is None else {"lr": self.lr}
        return Payload(groups={MODEL_GROUP: TensorGroup(dense=self.model), "control": TensorGroup(dense=self.control)},
                       meta=meta)

    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        """What ``fold`` needs of an update (or a reason): every model tensor as a delta, every control
        variate's change, and a numeric learning rate."""
        return lacking(update.payload, {DELTA_GROUP: self.model, "control": self.control}) or \
            mistyped(update.payload, {"lr": (int, float), "steps": int})

    def fold(self, round_number: int, update: ClientUpdate) -> None:
        """Exact running sums of n_i * delta y_i and of delta c_i (``algorithms.accumulate``)."""
        if self.folding is None:
            self.folding = fedavg.Folding(round_number, as_delta=True)
            self.controls = WeightedSum()
        self.folding.add(round_number, dict(update.payload.groups[DELTA_GROUP].dense), True,
                         fedavg.fold_weight(update, self.config.weighting))
        self.controls.add(dict(update.payload.groups["control"].dense), 1.0)
        if "lr" in update.payload.meta and update.index >= self.lr_from:  # the highest client index's, as sorted
            self.lr_from, self.lr = update.index, float(update.payload.meta["lr"])

    def close_round(self, round_number: int) -> dict[str, Any]:
        """x <- x + eta_g * (sum n_i delta y_i) / (sum n_i); c <- c + (sum delta c_i) / N."""
        folding, self.folding, self.lr_from = self.folding, None, -1
        if folding is None:
            return {}
        mean = folding.mean_into({name: np.zeros_like(value) for name, value in self.model.items()})
        for name, value in self.model.items():
            if fedavg.is_float(value):
                self.model[name] = (value.astype(np.float64) +
                                    self.config.global_lr * mean[name].astype(np.float64)).astype(value.dtype)
            else:
                self.model[name] = mean[name].astype(value.dtype)
        for name, value in self.control.items():
            total = self.controls.total(name) / self.context.num_clients
            self.control[name] = (value.astype(np.float64) + total).astype(value.dtype)
        norm = float(np.sqrt(sum(float(np.sum(np.square(c, dtype=np.float64))) for c in self.control.values())))
        return {"control_norm": norm}


    def evaluation_arrays(self) -> Arrays | None:
        return self.model

    def global_model(self) -> Arrays:
        return self.model

    def set_global_model(self, arrays: Arrays) -> None:
        self.model = arrays

    def state_dict(self) -> tuple[Arrays, dict[str, Any]]:
        arrays = {f"model/{k}": v for k, v in self.model.items()}
        arrays.update({f"control/{k}": v for k, v in self.control.items()})
        return arrays, {"lr": self.lr}

    def load_state_dict(self, arrays: Arrays, meta: dict[str, Any]) -> None:
        self.model = {k[len("model/"):]: v.copy() for k, v in arrays.items() if k.startswith("model/")}
        self.control = {k[len("control/"):]: v.copy() for k, v in arrays.items() if k.startswith("control/")}
        self.lr = meta.get("lr")


def full_gradient(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int,
                  task: Task | None = None) -> Arrays:
    """The gradient of the mean loss over all local samples at the model's current weights (Option I): each batch's
    mean loss (the task's; default cross-entropy) weighted by its share of the samples.

    Runs in training mode like the loop does, and restores every buffer (BatchNorm statistics) afterwards.
    """
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    params = dict(model.named_parameters())
    model.train()
    model.zero_grad(set_to_none=True)
    count = int(labels.shape[0])
    task = task or make_task()
    for start in range(0, count, batch_size):
        logits = model(inputs[start:start + batch_size])
        target = labels[start:start + batch_size]
        (task.loss(logits, target) * (int(target.shape[0]) / max(count, 1))).backward()
    grads = {name: (p.grad.detach().cpu().numpy().copy() if p.grad is not None else np.zeros(tuple(p.shape)))
             for name, p in params.items()}
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    return grads


class Client(BaseClient):
    """Trains with the (c - c_i) correction and keeps its own control variate c_i on the device."""

    def __init__(self, config: Config, client_index: int) -> None:
        self.config = config
        self.client_index = client_index
        self.received: Arrays = {}
        self.own: Arrays = {}
        self.last_lr: float | None = None
        self.reset_round({})

    def reset_round(self, control: Arrays, hinted_lr: float | None = None) -> None:
        self.control = control
        self.hinted_lr = hinted_lr
        self.settings_lr: float | None = None
        self.gradient_at_x: Arrays | None = None
        self.frozen: dict[str, np.ndarray] = {}
        self.difference: dict[str, torch.Tensor] = {}

    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        self.received = fedavg.receive_model(payload, model)
        control = {name: np.array(value, copy=True) for name, value in payload.groups["control"].dense.items()}
        self.reset_round(control, payload.meta.get("lr"))
        params = dict(model.named_parameters())
        for name, value in control.items():
            own = self.own.setdefault(name, np.zeros_like(value))
            if np.any(value != own):
                self.difference[name] = torch.from_numpy(
                    (value.astype(np.float64) - own).astype(value.dtype)).to(params[name].dtype)

    def before_training(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                        settings: TrainSettings) -> None:
        """Learn this round's eta_l and, for Option I, take the full local gradient at the received x."""
        self.settings_lr = settings.lr
        if self.config.option == "I":
            self.gradient_at_x = full_gradient(model, inputs, labels, settings.batch_size,
                                               task_of(settings, labels))

    def freeze(self, frozen: Mapping[str, np.ndarray]) -> None:
        """Coordinates (True) whose c_i stays unchanged this round; called after ``on_receive``."""
        self.frozen = {name: np.asarray(mask, dtype=bool) for name, mask in frozen.items()}

    def step_lr(self) -> float:
        for lr in (self.settings_lr, self.last_lr, self.hinted_lr):
            if lr is not None:
                return float(lr)
        raise RuntimeError("SCAFFOLD's update-space correction needs the local learning rate, and none is known "
                           "yet (no before_training call, no earlier round, no 'lr' in the downlink)")

    def after_backward(self, model: nn.Module) -> None:
        if self.config.correction != "gradient" or not self.difference:
            return
        with torch.no_grad():
            for name, param in model.named_parameters():
                if param.grad is not None and name in self.difference:
                    param.grad.add_(self.difference[name])

    def after_step(self, model: nn.Module) -> None:
        if self.config.correction != "update" or not self.difference:
            return
        lr = self.step_lr()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in self.difference:
                    param.add_(self.difference[name], alpha=-lr)

    def next_control(self, name: str, trained: np.ndarray, stats: LocalStats) -> np.ndarray:
        own, control = self.own[name], self.control[name]
        if self.config.option == "I":
            if self.gradient_at_x is None:
                raise RuntimeError("SCAFFOLD Option I needs before_training(model, inputs, labels, settings)")
            target = self.gradient_at_x[name].astype(own.dtype)
        elif stats.steps == 0:
            target = own
        else:
            drift = (self.received[name].astype(np.float64) - trained) / (stats.steps * stats.lr)
            target = (own.astype(np.float64) - control + drift).astype(own.dtype)
        if name in self.frozen:
            target = np.where(self.frozen[name], own, target)
        return target

    def make_update(self, round_number: int, model: nn.Module, stats: LocalStats) -> Payload:
        trained = model_arrays(model)
        delta = {name: (value - self.received[name]) if fedavg.is_float(value) else value
                 for name, value in trained.items()}
        targets = {name: self.next_control(name, trained[name], stats) for name in self.control}
        change = {name: (targets[name].astype(np.float64) - self.own[name]).astype(self.own[name].dtype)
                  for name in targets}
        self.own = {name: (own.astype(np.float64) + change[name]).astype(own.dtype) if name in change else own
                    for name, own in self.own.items()}
        self.last_lr = stats.lr
        return Payload(groups={"delta": TensorGroup(dense=delta), "control": TensorGroup(dense=change)},
                       meta={"steps": stats.steps, "lr": stats.lr})

    def state_dict(self) -> Arrays:
        state = {f"control/{name}": value for name, value in self.own.items()}
        if self.last_lr is not None:
            state["lr"] = np.array(self.last_lr, dtype=np.float64)
        return state

    def load_state_dict(self, state: Arrays) -> None:
        self.own = {k[len("control/"):]: np.array(v, copy=True) for k, v in state.items() if k.startswith("control/")}
        self.last_lr = float(state["lr"]) if "lr" in state else None
