"""fedcos (docs/algorithms.md section 9): on-device drift correction and cosine-similarity-weighted aggregation.

Client: keeps c (one tensor per trainable parameter) as device state. Each step it takes the minibatch gradient g,
steps with g - c (``after_backward``) and then sets c <- c + eta_c (g - c) (``after_step``); it uploads
Delta_i = theta_i - theta. Server: g = sum n_i/n Delta_i, cos_i = <Delta_i, g> / (||Delta_i|| ||g|| + 1e-8),
w_i = softmax(cos_i / tau), theta <- sum w_i theta_i (= theta + sum w_i Delta_i); a client with ||Delta_i|| < 1e-6 is
left out. It also chooses the round's participants (``select``: a fraction R, clients that missed the previous
deadline weighted up) and hears of missed deadlines (``missed``). Must not import a transport.

Decisions where the papers are silent (docs/algorithms.md records them too):
- eta_c defaults to the local learning rate, which the client learns from the optional ``before_training(model,
  inputs, labels, settings)`` hook (the loop calls it before the first step; SCAFFOLD uses the same hook); without
  it, set ``eta_c`` explicitly, else the first step raises.
- ``cv_every`` = K counts this device's rounds: c is updated on its 1st, (K+1)th, (2K+1)th... participation and
  frozen (still applied) in the others. ``reset_each_round`` restarts c from zeros every round; it is an error with
  ``warm_start``, which it would discard.
- The cosine uses the trainable tensors (BN running statistics and integer buffers are not directions); the
  weights then average every float tensor; integer buffers take the lower median, as in FedAvg. ``cos_layers`` = L > 0
  uses the last L layers of ``context.layout.layers`` (modules with state, registration order); 0 uses all. The
  1e-6 floor applies to the norm over the same tensors. With every client left out, the model does not move.
- ``warm_start``: the first round is a warm-up round. The model does not change; each participant runs the loop on
  the received model, restoring its parameters and buffers after every step, and uploads its mean raw gradient;
  the server averages them by n_i/n and sends the result as c (group ``cv``) with the model to every client until
  that client has reported once; a device installs it only if it has not installed one before.
- Selection: m = ceil(R |available|) clients without replacement, a client that missed the deadline of round t
  having weight ``boost`` (default 2) instead of 1 in round t + 1. R must be in [0.3, 1] (the article's floor).
- ``quantize`` sends uploads (and c when it travels) as codec ``int8`` values: linear, one scale per tensor; the
  codec de-quantizes on decode, before any averaging. Integer buffers (sent as values, not deltas) stay lossless.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedge.algorithms.base import (
    Arrays,
    ClientUpdate,
    LocalStats,
    Payload,
    ServerContext,
    lacking,
    learned_floats,
    load_into,
    model_arrays,
)
from fedge.algorithms.contract import BaseClient, HeldServer
from fedge.algorithms.fedavg import average, is_float
from fedge.algorithms.loop import TrainSettings
from fedge.codec import TensorGroup

NORM_FLOOR = 1e-6


@dataclass(frozen=True)
class Config:
    tau: float = 1.0
    eta_c: float | None = None
    reset_each_round: bool = False
    warm_start: bool = False
    cv_every: int = 1
    cos_layers: int = 0
    sample_rate: float = 0.5
    boost: float = 2.0
    quantize: bool = False

    def __post_init__(self) -> None:
        if not self.tau > 0:
            raise ValueError(f"algorithm.tau must be > 0, got {self.tau}")
        if self.eta_c is not None and self.eta_c < 0:
            raise ValueError(f"algorithm.eta_c must be >= 0, got {self.eta_c}")
        if self.cv_every < 1 or self.cos_layers < 0 or self.boost < 1:
            raise ValueError("algorithm.cv_every must be >= 1, cos_layers >= 0 and boost >= 1")
        if not 0.3 <= self.sample_rate <= 1:
            raise ValueError(f"algorithm.sample_rate must be in [0.3, 1], got {self.sample_rate}")
        if self.reset_each_round and self.warm_start:
            raise ValueError("algorithm.reset_each_round would discard the warm-start c; choose one")

    @property
    def value_dtype(self) -> str:
        return "int8" if self.quantize else "f32"


def cosine_weights(deltas: Sequence[np.ndarray], sizes: Sequence[int], tau: float) -> tuple[np.ndarray, np.ndarray]:
    """(weights, kept mask) over flattened updates: softmax(cos_i / tau) among clients with norm >= 1e-6."""
    norms = np.array([np.linalg.norm(d) for d in deltas])
    kept = norms >= NORM_FLOOR
    weights = np.zeros(len(deltas))
    if not kept.any():
        return weights, kept
    share = np.array(sizes, dtype=np.float64)[kept]
    share = share / share.sum() if share.sum() > 0 else np.full(len(share), 1 / len(share))
    kept_deltas = [d for d, keep in zip(deltas, kept, strict=True) if keep]
    direction = sum(p * d for p, d in zip(share, kept_deltas, strict=True))
    cosines = np.array([float(d @ direction) for d in kept_deltas]) / (norms[kept] * np.linalg.norm(direction) + 1e-8)
    logits = cosines / tau
    exps = np.exp(logits - logits.max())
    weights[kept] = exps / exps.sum()
    return weights, kept


class Server(HeldServer):
    """The global model, the cosine weighting, the participant selection and the warm-start c."""

    def __init__(self, config: Config, initial: Arrays, context: ServerContext) -> None:
        self.config = config
        self.context = context
        self.model: Arrays = {name: array.copy() for name, array in initial.items()}
        layout = context.layout
        layers = [names for names in layout.layers.values()]
        chosen = layers[-config.cos_layers:] if config.cos_layers else layers
        learned = set(learned_floats(layout, initial))
        self.cos_names = [n for names in chosen for n in names if n in learned]
        self.boosted: dict[int, int] = {}
        self.warmed = not config.warm_start
        self.initial_c: Arrays = {}
        self.c_sent: set[int] = set()

    def select(self, round_number: int, available: Sequence[int], rng: np.random.Generator) -> list[int] | None:
        if not available:
            return []
        self.boosted = {c: r for c, r in self.boosted.items() if r >= round_number}
        count = min(len(available), math.ceil(self.config.sample_rate * len(available) - 1e-9))
        weights = np.array([self.config.boost if self.boosted.get(c) == round_number else 1.0 for c in available])
        picked = rng.choice(np.asarray(available), size=count, replace=False, p=weights / weights.sum())
        return sorted(int(c) for c in picked)

    def missed(self, round_number: int, client_indices: Sequence[int]) -> None:
        for index in client_indices:
            self.boosted[int(index)] = round_number + 1

    def downlink(self, round_number: int, client_index: int) -> Payload:
        groups = {"model": TensorGroup(dense=self.model)}
        if not self.warmed:
            return Payload(groups=groups, meta={"phase": "warmup"})
        if self.initial_c and client_index not in self.c_sent:
            groups["cv"] = TensorGroup(dense=self.initial_c, value_dtype=self.config.value_dtype)
        return Payload(groups=groups)

    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        """What ``fold`` needs of an update (or a reason): the mean gradients while warming up, afterwards
        the delta of every model tensor."""
        if not self.warmed:  # the mean gradient of every float parameter (all of them get one in THE loop)
            parameters = [n for n in self.context.layout.parameters if n in self.model and is_float(self.model[n])]
            return lacking(update.payload, {"grad": parameters or list(self.cos_names)})
        return lacking(update.payload, {"delta": self.model})

    def aggregate_held(self, round_number: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        if not updates:
            return {}
        if not self.warmed:
            grads = [dict(u.payload.groups["grad"].dense) for u in updates]
            sizes = np.array([max(u.num_samples, 0) for u in updates], dtype=np.float64)
            share = sizes / sizes.sum() if sizes.sum() > 0 else np.full(len(updates), 1 / len(updates))
            self.initial_c = average(grads[0], grads, share, as_delta=False)
            self.warmed = True
            return {"cos_warmup_clients": len(updates)}
        deltas = [dict(u.payload.groups["delta"].dense) for u in updates]
        flat = [np.concatenate([np.asarray(d[n], np.float64).ravel() for n in self.cos_names]) for d in deltas]
        weights, kept = cosine_weights(flat, [u.num_samples for u in updates], self.config.tau)
        self.c_sent.update(u.index for u in updates)
        if kept.any():
            kept_deltas = [d for d, keep in zip(deltas, kept, strict=True) if keep]
            self.model = average(self.model, kept_deltas, weights[kept], as_delta=True)
        return {"cos_excluded": int((~kept).sum()),
                "cos_weights": {u.client_id: float(w) for u, w in zip(updates, weights, strict=True)}}

    def evaluation_arrays(self) -> Arrays | None:
        return self.model

    def state_dict(self) -> tuple[Arrays, dict[str, Any]]:
        arrays = {f"model/{k}": v for k, v in self.model.items()}
        arrays.update({f"c0/{k}": v for k, v in self.initial_c.items()})
        meta = {"boosted": {str(k): v for k, v in self.boosted.items()}, "warmed": self.warmed,
                "c_sent": sorted(self.c_sent)}
        return arrays, meta

    def load_state_dict(self, arrays: Arrays, meta: dict[str, Any]) -> None:
        self.model = {k[6:]: v.copy() for k, v in arrays.items() if k.startswith("model/")}
        self.initial_c = {k[3:]: v.copy() for k, v in arrays.items() if k.startswith("c0/")}
        self.boosted = {int(k): int(v) for k, v in meta.get("boosted", {}).items()}
        self.warmed = bool(meta.get("warmed", not self.config.warm_start))
        self.c_sent = {int(i) for i in meta.get("c_sent", [])}


class Client(BaseClient):
    """Drift-corrected local steps; c persists on the device; uploads the delta (or, warming up, the mean gradient)."""

    def __init__(self, config: Config, client_index: int) -> None:
        self.config = config
        self.client_index = client_index
        self.c: dict[str, torch.Tensor] = {}
        self.rounds = 0
        self.has_initial_c = False
        self.lr: float | None = None
        self.received: Arrays = {}
        self.warming = False
        self.update_c = True
        self.gradients: dict[str, torch.Tensor] = {}
        self.steps = 0

    def before_training(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                        settings: TrainSettings) -> None:
        """Learn the local learning rate (eta_c's default) from the loop's settings."""
        self.lr = settings.lr

    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        load_into(model, payload.groups["model"].dense)
        self.received = model_arrays(model)
        self.warming = payload.meta.get("phase") == "warmup"
        self.gradients, self.steps = {}, 0
        if "cv" in payload.groups and not self.has_initial_c:
            initial = payload.groups["cv"].dense
            self.c = {n: torch.tensor(np.asarray(a), dtype=torch.float32) for n, a in initial.items()}
            self.has_initial_c = True
        if self.config.reset_each_round:
            self.c = {}
        for name, parameter in model.named_parameters():
            own = self.c.get(name)
            self.c[name] = torch.zeros_like(parameter.detach()) if own is None else own.to(parameter)
        self.update_c = self.rounds % self.config.cv_every == 0

    @torch.no_grad()
    def after_backward(self, model: nn.Module) -> None:
        self.steps += 1
        for name, parameter in model.named_parameters():
            if parameter.grad is None:
                continue
            if self.warming:
                self.gradients.setdefault(name, torch.zeros_like(parameter)).add_(parameter.grad)
                parameter.grad.zero_()
            else:
                self.gradients[name] = parameter.grad.clone()
                parameter.grad.sub_(self.c[name])

    @torch.no_grad()
    def after_step(self, model: nn.Module) -> None:
        if self.warming:
            load_into(model, {n: self.received[n] for n, _ in model.named_parameters()})
            return
        if not self.update_c:
            return
        rate = self.config.eta_c if self.config.eta_c is not None else self.lr
        if rate is None:
            raise RuntimeError("fedcos needs eta_c: set algorithm.eta_c, or the runtime must call before_training")
        for name, gradient in self.gradients.items():
            self.c[name].add_(gradient - self.c[name], alpha=rate)

    def make_update(self, round_number: int, model: nn.Module, stats: LocalStats) -> Payload:
        dtype = self.config.value_dtype
        if self.warming:
            load_into(model, self.received)
            mean = {n: (g / max(self.steps, 1)).cpu().numpy() for n, g in self.gradients.items()}
            return Payload(groups={"grad": TensorGroup(dense=mean, value_dtype=dtype)})
        self.rounds += 1
        trained = model_arrays(model)
        delta = {n: v - self.received[n] if is_float(v) else v for n, v in trained.items()}
        return Payload(groups={"delta": TensorGroup(dense=delta, value_dtype=dtype)})

    def state_dict(self) -> Arrays:
        state = {f"c/{name}": tensor.detach().cpu().numpy().copy() for name, tensor in self.c.items()}
        state["rounds"] = np.array(self.rounds, dtype=np.int64)
        state["has_initial_c"] = np.array(self.has_initial_c)
        return state

    def load_state_dict(self, state: Arrays) -> None:
        self.c = {k[2:]: torch.tensor(v) for k, v in state.items() if k.startswith("c/")}
        self.rounds = int(state["rounds"]) if "rounds" in state else 0
        self.has_initial_c = bool(state["has_initial_c"]) if "has_initial_c" in state else False
