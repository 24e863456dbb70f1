"""ef-fedavg / ef-fedprox: Fedge's compressed mode, a wrapper over a base algorithm (docs/ef.md is its reference).

The whole model trains (no freezing); both directions carry the top ``keep`` fraction of a delta (k from
``codec.retained_count``) with indices, values in ``value_dtype``, and each side keeps an error-feedback residual.
Defaults keep = 0.1 in f16, as the issue that introduced the mode specifies; keep = 0.2 in int8 (one scale per
tensor) costs about the same bytes and trailed dense FedAvg less in our measurements (docs/ef.md, "Measured"), so
the harness runs both.
- Public model X: the model every client replicates bit for bit. It starts as the initial model (rounded through
  f16 when the value encoding is lossy, so the first sync costs 2 bytes a value) and advances only by the
  decoded broadcast delta D_t, applied by the same function (``advance``) on both sides.
- Server: u = sum_i p_i decode(U_i) + e; D_t = top-keep(u); e <- u - decode(D_t); X <- X + decode(D_t).
- Client: replays the deltas it misses onto its replica (device state), trains from X through the base client's
  hooks (FedProx's anchor is X), uploads U_i = top-keep(y - X + e_i) and keeps e_i <- (y - X + e_i) - decode(U_i).
- Resync: the server tracks the public version (the round whose aggregate made it) each client holds. A client one
  version behind gets D_t; further behind, the chain of stored deltas or a dense f32 copy of X, whichever encodes
  smaller; a client never synced (or forgotten) gets X dense. Every downlink names its versions and the CRC of X,
  which the client checks after applying, so a drifted replica fails loudly.
Float buffers (BatchNorm running statistics) are treated like weights; integer buffers travel dense with every
delta (the server takes the clients' maximum). Must not import a transport.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from torch import nn

from fedge import codec
from fedge.algorithms import fedavg
from fedge.algorithms.accumulate import FlatMean
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
    mistyped,
    wrapper_config,
)
from fedge.algorithms.contract import BaseServer, WrappedClient
from fedge.algorithms.sparse import FlatLayout, compress, decoded, wire_dtype
from fedge.codec import SparseSection, TensorGroup

VALUE_DTYPES = ("f32", "f16", "bf16", "int8", "ternary")


@dataclass(frozen=True)
class Config:
    base: Any = None
    keep: float = 0.1
    value_dtype: str = "f16"
    history: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.keep <= 1:
            raise ValueError(f"algorithm.keep must lie in (0, 1], got {self.keep}")
        if self.value_dtype not in VALUE_DTYPES:
            raise ValueError(f"algorithm.value_dtype must be one of {VALUE_DTYPES}, got {self.value_dtype!r}")
        if isinstance(self.history, bool) or not isinstance(self.history, int) or self.history < 1:
            raise ValueError(f"algorithm.history must be an int >= 1, got {self.history!r}")


def make_config(base_module: ModuleType, options: Mapping[str, Any]) -> Config:
    """ef's own options plus the base's (e.g. FedProx's mu); an option neither knows is an error."""
    return wrapper_config(Config, base_module, options)  # type: ignore[no-any-return]


def float_layout(arrays: Mapping[str, np.ndarray]) -> FlatLayout:
    return FlatLayout.of(arrays, [name for name, value in arrays.items() if is_float(value)])


def advance(public: Arrays, layout: FlatLayout, indices: np.ndarray, values: np.ndarray,
            integers: Mapping[str, np.ndarray]) -> Arrays:
    """X + D: the one float32 update both sides apply, so that their copies stay bit-identical."""
    flat = layout.flat(public)
    flat[indices] += np.asarray(values, dtype=np.float32)
    moved = layout.split(flat)
    return {name: moved[name] if name in moved else np.array(integers.get(name, value), copy=True)
            for name, value in public.items()}


def public_crc(public: Arrays) -> int:
    crc = 0
    for name, value in public.items():
        crc = zlib.crc32(name.encode(), crc)
        crc = zlib.crc32(np.ascontiguousarray(value).tobytes(), crc)
    return crc


def encoded_size(groups: Mapping[str, TensorGroup]) -> int:
    return len(codec.encode(codec.Task(run_id="size", round=0, sender="algorithms", groups=dict(groups))))


@dataclass(frozen=True)
class Delta:
    """One broadcast delta: the version it applies to, its positions, its values before encoding, integer buffers."""

    previous: int
    indices: np.ndarray
    values: np.ndarray
    integers: Arrays


class Server(BaseServer):
    """Keeps the public model, its own residual, the recent broadcast deltas and every client's version."""

    def __init__(self, config: Config, initial: Arrays, context: ServerContext, base_module: ModuleType) -> None:
        if base_module.Server is not fedavg.Server:
            raise ValueError(f"ef aggregates as FedAvg does (its server half replaces the base's): its base must "
                             f"have FedAvg's server half (fedavg, fedprox), not {base_module.__name__}'s")
        self.config = config
        self.context = context
        self.layout = float_layout(initial)
        self.start_dtype = "f32" if config.value_dtype == "f32" else "f16"
        start = decoded(TensorGroup(dense=initial, value_dtype=self.start_dtype)).dense
        self.public: Arrays = {name: np.array(start[name], dtype=initial[name].dtype) for name in initial}
        self.residual = np.zeros(self.layout.size, dtype=np.float32)
        self.synced = np.full(context.num_clients, -1, dtype=np.int64)
        self.version = 0
        self.history: dict[int, Delta] = {}
        self.resyncs = 0
        self.crc = public_crc(self.public)
        self.folding: FlatMean | None = None  # the round being folded (not checkpointed: a round is redone whole)
        self.stale = 0                        # ... and its updates against an older public model

    def delta_group(self, version: int) -> TensorGroup:
        delta = self.history[version]
        section = SparseSection.with_indices(self.layout.names, self.layout.shapes, delta.indices, delta.values)
        return TensorGroup(dense=delta.integers, sparse=section, value_dtype=wire_dtype(self.config.value_dtype))

    def chain(self, start: int) -> list[int] | None:
        """The stored versions leading from ``start`` to the current one, or None when one is missing."""
        versions = [v for v in sorted(self.history) if v > start]
        previous = start
        for version in versions:
            if self.history[version].previous != previous:
                return None
            previous = version
        return versions if previous == self.version else None

    def downlink(self, round_number: int, client_index: int) -> Payload:
        start = int(self.synced[client_index])
        meta = {"ef_to": self.version, "ef_crc": self.crc}
        versions = self.chain(start) if start >= 0 else None
        dense_dtype = self.start_dtype if self.version == 0 else "f32"
        dense = {"public": TensorGroup(dense=self.public, value_dtype=dense_dtype)}
        if versions is not None:
            groups = {f"delta-{v}": self.delta_group(v) for v in versions}
            if len(versions) <= 1 or encoded_size(groups) < encoded_size(dense):
                return Payload(groups=groups, meta={**meta, "ef_from": start, "ef_rounds": versions})
        self.resyncs += 1
        return Payload(groups=dense, meta={**meta, "ef_from": -1, "ef_rounds": []})

    def forget(self, client_index: int) -> None:
        """The next downlink to this client is a dense copy (e.g. after it reported a lost replica)."""
        self.synced[client_index] = -1

    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        """What ``aggregate`` needs of an update (or a reason): one ``update`` group whose sparse section covers the
        float tensors in the layout's order, the integer tensors dense, and the replica version it was made from."""
        integers = [name for name in self.public if name not in self.layout.names]
        problem = lacking(update.payload, {"update": integers}) or mistyped(update.payload, {"ef_base": int})
        if problem:
            return problem
        base = update.payload.meta.get("ef_base", -1)
        if not -1 <= base <= self.version:
            return f"meta.ef_base {base} is not a version this coordinator has published (-1 ... {self.version})"
        sparse = update.payload.groups["update"].sparse
        if sparse is None or tuple(sparse.names) != self.layout.names:
            return "an ef update must carry the float tensors as one sparse section, in the model's order"
        return ""

    def fold(self, round_number: int, update: ClientUpdate) -> None:
        """An update against the current public model joins the round's exact sums (``algorithms.accumulate``); a
        stale one only tells which public model its client holds."""
        base = int(update.payload.meta.get("ef_base", -1))
        self.synced[update.index] = base
        if self.folding is None:
            self.folding, self.stale = FlatMean(self.layout.size), 0
        if base != self.version:
            self.stale += 1
            return
        group = update.payload.groups["update"]
        if group.sparse is None or tuple(group.sparse.names) != self.layout.names:
            raise ValueError("an ef update must carry the float tensors as one indexed sparse section")
        self.folding.add(group.sparse.values, group.sparse.positions(),
                         fedavg.fold_weight(update, self.config.base.weighting), group.dense)

    def aggregate_folded(self, round_number: int) -> dict[str, Any]:
        folding, self.folding = self.folding, None
        if folding is None or not folding.count:
            return {"ef_stale_updates": self.stale if folding is not None else 0, "ef_dense_resyncs": self.resyncs}
        merged = {name: value.astype(self.public[name].dtype) for name, value in folding.maxima.items()}
        sent = compress(self.layout, folding.mean().astype(np.float32) + self.residual, self.config.keep,
                        self.config.value_dtype, dense=merged)
        self.residual = sent.residual
        self.public = advance(self.public, self.layout, sent.indices, sent.decoded, merged)
        self.crc = public_crc(self.public)
        self.history[round_number] = Delta(self.version, sent.indices, sent.group.sparse.values, merged)  # type: ignore[union-attr]
        self.version = round_number
        for old in sorted(self.history)[:-self.config.history]:
            del self.history[old]
        metrics = {"ef_stale_updates": self.stale, "ef_dense_resyncs": self.resyncs,
                   "ef_sent_down": int(sent.indices.size), "ef_residual_norm": float(np.linalg.norm(self.residual))}
        self.resyncs = 0
        return metrics

    def aggregate(self, round_number: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        self.folding = None
        for update in updates:
            self.fold(round_number, update)
        return self.aggregate_folded(round_number)

    def evaluation_arrays(self) -> Arrays | None:
        return self.public

    def state_dict(self) -> tuple[Arrays, dict[str, Any]]:
        arrays: Arrays = {f"public/{k}": v for k, v in self.public.items()}
        arrays["residual"] = self.residual
        arrays["synced"] = self.synced
        for version, delta in self.history.items():
            arrays[f"history/{version}/indices"] = delta.indices
            arrays[f"history/{version}/values"] = delta.values
            arrays.update({f"history/{version}/int/{k}": v for k, v in delta.integers.items()})
        meta = {"version": self.version, "history": [[v, d.previous] for v, d in self.history.items()]}
        return arrays, meta

    def load_state_dict(self, arrays: Arrays, meta: dict[str, Any]) -> None:
        self.public = {k[len("public/"):]: v.copy() for k, v in arrays.items() if k.startswith("public/")}
        self.residual = np.array(arrays["residual"], dtype=np.float32)
        self.synced = np.array(arrays["synced"], dtype=np.int64)
        self.crc = public_crc(self.public)
        self.version = int(meta["version"])
        self.history = {}
        for version, previous in meta["history"]:
            prefix = f"history/{version}/int/"
            integers = {k[len(prefix):]: v.copy() for k, v in arrays.items() if k.startswith(prefix)}
            self.history[int(version)] = Delta(int(previous), arrays[f"history/{version}/indices"].copy(),
                                               arrays[f"history/{version}/values"].copy(), integers)


class Client(WrappedClient):
    """The base client training from its replica of the public model, with its own residual as device state."""

    def __init__(self, config: Config, client_index: int, base_module: ModuleType) -> None:
        self.config = config
        self.base = base_module.Client(config.base, client_index)
        self.replica: Arrays = {}
        self.version = -1
        self.residual: np.ndarray | None = None

    def sync(self, payload: Payload) -> None:
        """Bring the replica to the version the packet names, and check it against the server's CRC."""
        meta = payload.meta
        if "public" in payload.groups:
            self.replica = {k: np.array(v, copy=True) for k, v in payload.groups["public"].dense.items()}
            self.version = int(meta["ef_to"])
        elif self.version < int(meta["ef_from"]):
            raise RuntimeError(f"ef: the replica is at version {self.version} but the packet starts at "
                               f"{meta['ef_from']}; the coordinator must resync this client densely (forget)")
        for version in meta["ef_rounds"]:
            if version > self.version:
                group = payload.groups[f"delta-{version}"]
                section = group.sparse
                if section is None:
                    raise ValueError(f"ef: delta-{version} carries no sparse section")
                layout = FlatLayout(section.names, section.shapes)
                self.replica = advance(self.replica, layout, section.positions(), section.values, group.dense)
                self.version = int(version)
        if self.version != int(meta["ef_to"]) or public_crc(self.replica) != int(meta["ef_crc"]):
            raise RuntimeError(f"ef: the replica (version {self.version}) differs from the public model "
                               f"(version {meta['ef_to']}); it needs a dense resync")

    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        self.sync(payload)
        model_group = {MODEL_GROUP: TensorGroup(dense=self.replica)}
        self.base.on_receive(round_number, Payload(groups=model_group, meta=payload.meta), model)

    def make_update(self, round_number: int, model: nn.Module, stats: LocalStats) -> Payload:
        payload: Payload = self.base.make_update(round_number, model, stats)
        is_model = MODEL_GROUP in payload.groups
        trained = dict(payload.groups[MODEL_GROUP if is_model else DELTA_GROUP].dense)
        layout = float_layout(self.replica)
        delta = layout.flat(trained) - layout.flat(self.replica) if is_model else layout.flat(trained)
        if self.residual is None or self.residual.size != layout.size:
            self.residual = np.zeros(layout.size, dtype=np.float32)
        integers = {name: value for name, value in trained.items() if name not in layout.names}
        sent = compress(layout, delta + self.residual, self.config.keep, self.config.value_dtype, dense=integers)
        self.residual = sent.residual
        return Payload(groups={"update": sent.group}, meta={**payload.meta, "ef_base": self.version})

    def state_dict(self) -> Arrays:
        state: Arrays = {f"ef/public/{k}": v for k, v in self.replica.items()}
        state["ef/version"] = np.array(self.version, dtype=np.int64)
        if self.residual is not None:
            state["ef/residual"] = self.residual
        state.update(self.base.state_dict())
        return state

    def load_state_dict(self, state: Arrays) -> None:
        self.base.load_state_dict({k: v for k, v in state.items() if not k.startswith("ef/")})
        self.replica = {k[len("ef/public/"):]: np.array(v, copy=True) for k, v in state.items()
                        if k.startswith("ef/public/")}
        self.version = int(state["ef/version"]) if "ef/version" in state else -1
        residual = state.get("ef/residual")
        self.residual = None if residual is None else np.array(residual, dtype=np.float32)
