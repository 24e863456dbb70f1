"""FedAvg (McMahan et al. 2017; docs/algorithms.md section 1): the defaults every other algorithm builds on.

Server: x <- sum_i p_i y_i over the float tensors (parameters and float buffers), p_i by data size or uniform;
integer buffers (BatchNorm's num_batches_tracked) take the clients' lower median, never an average (one device's
counter cannot move it).
Client: load x, train, upload. Decision: the upload is the trained model itself (``upload = "model"``, default),
so that one client with p = 1 reproduces its local run bit for bit; ``upload = "delta"`` sends y - x and the server
computes x + sum p_i delta_i; a delta is scaled, on the device, under the bound the task names for it (under
differential privacy: the round's clip). Aggregation streams: each update is folded into exact sums of n_i y_i
(``algorithms.accumulate``) as it arrives, and the mean (sum n_i y_i) / (sum n_i) is taken when the round closes,
so the model is the same bit for bit whatever order updates arrived in. Must not import a transport.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from fedge.algorithms.accumulate import WeightedSum
from fedge.algorithms.base import (
    DELTA_GROUP,
    MODEL_GROUP,
    Arrays,
    ClientUpdate,
    LocalStats,
    Payload,
    ServerContext,
    is_float,
    lacking,
    load_into,
    model_arrays,
    weighted_sum,
)
from fedge.algorithms.contract import BaseClient, BaseServer
from fedge.codec import TensorGroup
from fedge.protocol.robust_rules import lower_median

UPLOADS = (MODEL_GROUP, DELTA_GROUP)


@dataclass(frozen=True)
class Config:
    weighting: str = "samples"
    upload: str = "model"

    def __post_init__(self) -> None:
        if self.weighting not in ("samples", "uniform"):
            raise ValueError(f"algorithm.weighting must be 'samples' or 'uniform', got {self.weighting!r}")
        if self.upload not in UPLOADS:
            raise ValueError(f"algorithm.upload must be one of {UPLOADS}, got {self.upload!r}")


def average(base: Arrays, uploads: Sequence[Arrays], weights: np.ndarray, as_delta: bool,
            names: Sequence[str] | None = None) -> Arrays:
    """The weighted aggregate of uploaded models (or of base + deltas) over ``names`` (default: all of base)."""
    result = dict(base)
    for name in names if names is not None else base:
        values = [upload[name] for upload in uploads]
        if not is_float(base[name]):
            result[name] = lower_median([np.asarray(v) for v in values]).astype(base[name].dtype)
        elif as_delta:
            total = base[name].astype(np.float64) + weighted_sum(values, weights).astype(np.float64)
            result[name] = total.astype(np.float32)
        else:
            result[name] = weighted_sum(values, weights)
    return result


def fold_weight(update: ClientUpdate, weighting: str) -> float:
    """An update's weight in the running sums: its sample count (``samples``), or 1 (``uniform``); 0 for an update
    of no samples, which counts only when no update of the round has any (then they weigh alike)."""
    if weighting == "uniform":
        return 1.0
    if weighting != "samples":
        raise ValueError(f"weighting must be 'samples' or 'uniform', got {weighting!r}")
    return float(max(update.num_samples, 0))


class Folding:
    """One round's running sums: those of weighted updates, and those of updates with no samples (weight 1)."""

    def __init__(self, round_number: int, as_delta: bool) -> None:
        self.round = round_number
        self.as_delta = as_delta
        self.weighted = WeightedSum()
        self.empty = WeightedSum()

    def add(self, round_number: int, arrays: Arrays, as_delta: bool, weight: float, discount: float = 1.0,
            counted: float = 1.0) -> None:
        """``discount`` and ``counted``: an asynchronous session's staleness factors (``ClientUpdate``'s)."""
        if round_number != self.round:
            raise ValueError(f"an update of round {round_number} folded into round {self.round}")
        if as_delta != self.as_delta:
            raise ValueError("updates mix models and deltas")
        base = weight if weight > 0 else 1.0
        (self.weighted if weight > 0 else self.empty).add(arrays, base * discount, base * counted)

    def mean_into(self, base: Arrays, names: Sequence[str] | None = None) -> Arrays:
        """base with each of ``names`` (default: all of base) replaced by the round's mean (or base + mean delta);
        integer tensors take the clients' lower median."""
        sums = self.weighted if self.weighted.count else self.empty
        result = dict(base)
        for name in names if names is not None else base:
            if not is_float(base[name]):
                if name in sums.integers:
                    result[name] = sums.integers.median(name).astype(base[name].dtype)
                continue
            if name not in sums.sums:
                continue
            mean = (sums.total(name) / sums.weight).astype(np.float32)  # the mean delta as a client receives it
            result[name] = (base[name].astype(np.float64) + mean if self.as_delta else mean).astype(np.float32)
        return result


def receive_model(payload: Payload, model: nn.Module) -> Arrays:
    """Load the downlink's model group into the model; returns a copy of what was received."""
    received = {name: array.copy() for name, array in payload.groups[MODEL_GROUP].dense.items()}
    load_into(model, received)
    return received


class Server(BaseServer):
    """Holds the global model x and averages what the clients upload."""

    def __init__(self, config: Config, initial: Arrays, context: ServerContext) -> None:
        self.config = config
        self.context = context
        self.model: Arrays = {name: array.copy() for name, array in initial.items()}
        self.folding: Folding | None = None  # the round being folded (not checkpointed: a round is redone whole)

    def downlink(self, round_number: int, client_index: int) -> Payload:
        return Payload(groups={MODEL_GROUP: TensorGroup(dense=self.model)})

    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        """What ``fold`` needs of an update (or a reason): the configured upload group, every model tensor."""
        return lacking(update.payload, {self.config.upload: self.model})

    def uploaded(self, update: ClientUpdate) -> tuple[Arrays, bool]:
        """The arrays a client uploaded and whether they are deltas."""
        groups = update.payload.groups
        if MODEL_GROUP in groups:
            return dict(groups[MODEL_GROUP].dense), False
        return dict(groups[DELTA_GROUP].dense), True

    def fold(self, round_number: int, update: ClientUpdate) -> None:
        arrays, as_delta = self.uploaded(update)
        folding = self.folding
        if folding is None:
            folding = self.folding = Folding(round_number, as_delta)
        folding.add(round_number, arrays, as_delta, fold_weight(update, self.config.weighting), update.discount,
                    update.counted)

    def close_round(self, round_number: int) -> dict[str, Any]:
        folding, self.folding = self.folding, None
        if folding is not None:
            self.model = folding.mean_into(self.model)
        return {}

    def change_reference(self, round_number: int, client_index: int) -> Arrays | None:
        return self.model  # what every client was sent this round (a "delta" group is a change already)

    def evaluation_arrays(self) -> Arrays | None:
        return self.model

    def global_model(self) -> Arrays:
        return self.model

    def set_global_model(self, arrays: Arrays) -> None:
        self.model = arrays

    def state_dict(self) -> tuple[Arrays, dict[str, Any]]:
        return {f"model/{k}": v for k, v in self.model.items()}, {}

    def load_state_dict(self, arrays: Arrays, meta: dict[str, Any]) -> None:
        self.model = {k[len("model/"):]: v for k, v in arrays.items() if k.startswith("model/")}


class Client(BaseClient):
    """Loads the received model, trains it through the loop unchanged, and uploads the result."""

    def __init__(self, config: Config, client_index: int) -> None:
        self.config = config
        self.client_index = client_index
        self.received: Arrays = {}
        self.clip = 0.0   # the task's bound on a delta upload (0: none)
        self.scale = 1.0  # ... and what the last delta was scaled by to fit it

    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        self.received = receive_model(payload, model)

    def on_bounds(self, round_number: int, norm_bounds: Mapping[str, float]) -> None:
        self.clip = float(norm_bounds.get(DELTA_GROUP, norm_bounds.get("*", 0.0)))

    def clip_scale(self) -> float:
        return self.scale

    def make_update(self, round_number: int, model: nn.Module, stats: LocalStats) -> Payload:
        trained = model_arrays(model)
        self.scale = 1.0
        if self.config.upload == MODEL_GROUP:
            return Payload(groups={MODEL_GROUP: TensorGroup(dense=trained)})
        delta = {
            name: (value - self.received[name]) if is_float(value) else value
            for name, value in trained.items()
        }
        norm = math.sqrt(sum(float(np.dot(v.ravel().astype(np.float64), v.ravel().astype(np.float64)))
                             for v in delta.values() if is_float(v)))
        if self.clip > 0 and norm > self.clip:
            self.scale = self.clip / norm
            delta = {name: (value.astype(np.float64) * self.scale).astype(value.dtype) if is_float(value) else value
                     for name, value in delta.items()}
        return Payload(groups={DELTA_GROUP: TensorGroup(dense=delta)})

    def state_dict(self) -> Arrays:
        return {}

    def load_state_dict(self, state: Arrays) -> None:
        return None
