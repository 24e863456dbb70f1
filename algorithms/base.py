"""The algorithm interface: what a server half and a client half of an algorithm offer, and what they exchange.

An algorithm is one module with ``Config`` (a frozen dataclass), ``Server`` and ``Client``. The coordinator calls the
server half and the agent's single training loop (``algorithms.loop``) its client half, through the typed contract
of ``algorithms.contract``. They exchange ``Payload``s (``protocol.payload``, torch-free: named codec tensor
groups plus a small metadata map), which the runtime encodes into packets. Must not import a transport or know
sockets; it knows models only through named numpy arrays and the torch module the loop trains.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from fedge.models import arrays_to_state, state_to_arrays
from fedge.protocol.payload import DELTA_GROUP, MODEL_GROUP, UPDATE_GROUPS, Arrays, ClientUpdate, Payload

__all__ = ["DELTA_GROUP", "MODEL_GROUP", "UPDATE_GROUPS", "Arrays", "ClientUpdate", "LocalStats", "ModelLayout",
           "Payload", "ServerContext", "TrainSettings"]




OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass(frozen=True)
class TrainSettings:
    """Local training settings sent by the coordinator: epochs, batch size, optimizer and its rates."""

    epochs: int = 1
    batch_size: int = 64
    lr: float = 1e-3
    optimizer: str = "adam"
    momentum: float = 0.0
    weight_decay: float = 0.0
    loss: str = "cross_entropy"
    class_weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "class_weights", tuple(float(w) for w in self.class_weights))
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"train.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("train.epochs and train.batch_size must be >= 1 and train.lr > 0")


@dataclass(frozen=True)
class ModelLayout:
    """What the server half knows of the model: tensor names by class, in state-dict order. ``parameters`` and
    ``buffers`` split ``names`` (trained by gradient, or kept beside); ``statistics`` are the BatchNorm buffers
    (running mean and variance, the batch count)."""

    names: tuple[str, ...]
    prunable: tuple[str, ...]
    batch_norm: tuple[str, ...]
    layers: Mapping[str, tuple[str, ...]]
    parameters: tuple[str, ...] = ()
    buffers: tuple[str, ...] = ()

    @property
    def statistics(self) -> tuple[str, ...]:
        buffers = set(self.buffers)
        return tuple(name for name in self.batch_norm if name in buffers)

    @classmethod
    def of(cls, model: nn.Module) -> ModelLayout:
        from fedge.models import batch_norm_names, layer_groups, prunable_names

        return cls(
            names=tuple(model.state_dict()),
            prunable=tuple(prunable_names(model)),
            batch_norm=tuple(batch_norm_names(model)),
            parameters=tuple(name for name, _ in model.named_parameters()),
            buffers=tuple(name for name, _ in model.named_buffers()),
            layers={k: tuple(v) for k, v in layer_groups(model).items()},
        )


@dataclass(frozen=True)
class ServerContext:
    """Facts of the session a server half may need: the client count N, the layout, the seed, whether the
    initial model is the model spec built from that seed (so a device can rebuild it; not so with ``model.init``),
    and whether the session is asynchronous (``round.mode = "async"``: an update trained from an older version is
    folded, under the staleness factors the coordinator set on it, not left out)."""

    num_clients: int
    layout: ModelLayout
    seed: int = 0
    initial_from_seed: bool = True
    asynchronous: bool = False


@dataclass(frozen=True)
class LocalStats:
    """What the training loop reports: optimizer steps taken, samples seen, mean loss, learning rate, and the size
    of every batch stepped on (for the meter's FLOP count)."""

    steps: int
    samples: int
    loss: float
    lr: float
    batch_sizes: tuple[int, ...] = ()


_KINDS: dict[Any, tuple[str, Callable[[Any], bool]]] = {
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    bool: ("true or false", lambda v: isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
}


def is_float(array: np.ndarray) -> bool:
    """Float tensors are averaged; integer ones (BatchNorm's batch count) are not."""
    return bool(np.issubdtype(np.asarray(array).dtype, np.floating))


def learned_floats(layout: ModelLayout, arrays: Mapping[str, np.ndarray]) -> list[str]:
    """The float tensors of the model that are not BatchNorm statistics, in state-dict order: what SCAFFOLD keeps
    control variates for, pFedLA mixes per layer and fedcos compares. The one place this rule lives."""
    statistics = set(layout.statistics)
    return [name for name in layout.names if name in arrays and is_float(arrays[name]) and name not in statistics]


def typed_options(config_cls: type, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` checked against the Config's field types (float, int, bool, str; other fields as given), a float
    field taking an integer as a float; ValueError naming the option and what it must be."""
    hints = typing.get_type_hints(config_cls)
    checked: dict[str, Any] = {}
    for key, value in options.items():
        kind = _KINDS.get(hints.get(key))
        if kind is not None and not kind[1](value):
            raise ValueError(f"algorithm.{key} must be {kind[0]}, got {value!r}")
        checked[key] = float(value) if hints.get(key) is float else value
    return checked


def config_from_options(config_cls: type, options: Mapping[str, Any]) -> Any:
    """Build an algorithm's frozen Config from a mapping; unknown keys are an error naming the valid ones, and a
    value of the wrong type one naming the option."""
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = set(options) - known
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} for this algorithm; valid: {sorted(known)}")
    return config_cls(**typed_options(config_cls, options))


def wrapper_config(config_cls: type, base_module: Any, options: Mapping[str, Any]) -> Any:
    """The Config of a wrapper algorithm (DSSA, ef-*): its own fields from ``options``, the rest validated by the
    base's Config into ``base``; an option neither knows is an error naming the valid ones."""
    own = {f.name for f in dataclasses.fields(config_cls)} - {"base"}
    known = own | {f.name for f in dataclasses.fields(base_module.Config)}
    unknown = set(options) - known
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} for this algorithm; valid: {sorted(known)}")
    base = config_from_options(base_module.Config, {k: v for k, v in options.items() if k not in own})
    return config_cls(base=base, **typed_options(config_cls, {k: v for k, v in options.items() if k in own}))


def lacking(payload: Payload, required: Mapping[str, Collection[str]], sparse: bool = False) -> str:
    """What a server half's aggregate would miss, or could not use, in an update: a reason naming a group it does
    not take, the first required group that is absent, the first tensor (dense or sparse) a required group lacks, a
    dense tensor it does not take, or a sparse section where it takes none; '' when the update carries exactly the
    required groups, each with exactly its tensors. ``sparse``: the aggregate takes a group's sparse section (and
    checks it itself), whose tensors then count as present. Server halves answer ``check_update`` with it, so that
    the coordinator refuses such an update (``invalid-update``) instead of failing in the middle of an aggregate."""
    extra = sorted(set(payload.groups) - set(required))
    if extra:
        return f"the update carries group {extra[0]!r}, which this algorithm does not take (it takes: " \
               f"{', '.join(sorted(required))})"
    for group_name, names in required.items():
        group = payload.groups.get(group_name)
        if group is None:
            carried = ", ".join(sorted(payload.groups)) or "none"
            return f"the update lacks its group {group_name!r} (it carries: {carried})"
        if group.sparse is not None and not sparse:
            return f"group {group_name!r} carries a sparse section, which this algorithm does not take (its " \
                   "updates are dense)"
        present = set(group.dense) | (set(group.sparse.names) if group.sparse is not None else set())
        missing = [name for name in names if name not in present]
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            return f"group {group_name!r} lacks tensor {missing[0]!r}{more}"
        unused = sorted(set(group.dense) - set(names))
        if unused:
            return f"group {group_name!r} carries tensor {unused[0]!r}, which this algorithm does not take there"
    return ""


def mistyped(payload: Payload, types: Mapping[str, type | tuple[type, ...]]) -> str:
    """A reason when a meta key the aggregate reads holds a value of another type (bools are not numbers), or ''."""
    for key, kinds in types.items():
        if key in payload.meta:
            value = payload.meta[key]
            if isinstance(value, bool) or not isinstance(value, kinds):
                return f"meta.{key} must be {getattr(kinds, '__name__', kinds)}, got {value!r:.40}"
    return ""


def weights_of(updates: Sequence[ClientUpdate], weighting: str) -> np.ndarray:
    """Aggregation weights p_i: by data size (n_i / sum n) or uniform; they sum to 1."""
    if not updates:
        raise ValueError("no updates to weight")
    if weighting == "uniform":
        return np.full(len(updates), 1.0 / len(updates))
    if weighting != "samples":
        raise ValueError(f"weighting must be 'samples' or 'uniform', got {weighting!r}")
    sizes = np.array([max(u.num_samples, 0) for u in updates], dtype=np.float64)
    if sizes.sum() <= 0:
        return np.full(len(updates), 1.0 / len(updates))
    return sizes / sizes.sum()


def weighted_sum(arrays: Sequence[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """sum_i w_i a_i accumulated in float64 and returned as float32."""
    total = np.zeros(arrays[0].shape, dtype=np.float64)
    for weight, array in zip(weights, arrays, strict=True):
        total += weight * array.astype(np.float64, copy=False)
    return total.astype(np.float32)


def load_into(model: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Load a (possibly partial) set of named arrays into the model."""
    arrays_to_state(model, dict(arrays), strict=False)


def model_arrays(model: nn.Module) -> Arrays:
    return state_to_arrays(model)
