"""ef-fedavg / ef-fedprox: Fedge's compressed mode, a wrapper over a base algorithm (docs/ef.md is its reference).

The whole model trains (no freezing); both directions carry the top ``keep`` fraction of a delta (k from
``codec.retained_count``) with indices, values in ``value_dtype``, and each side keeps an error-feedback residual.
Defaults keep = 0.1 in f16, as the issue that introduced the mode specifies; the embedded default session uses
keep = 0.3 with ternary values (docs/ef.md, "Measured").
- Server: S, its exact model, is the keyframe K plus its residual e = S - K. A round's updates (deltas from the
  round's public model P) are added to S: u = sum_i p_i decode(U_i) + e; C = top-keep(u). At a keyframe round
  K <- K + decode(C) and e <- u - decode(C); at any other round e <- u and C is the next round's catch-up, P = K +
  decode(C). S is evaluated. ``keyframes.PublicModel`` keeps K, C, the keyframe history and what each client holds.
- Client: brings its copy of K to the packet's keyframe version (the keyframe deltas it lacks, or K dense), adds the
  catch-up, checks versions and CRCs (``keyframes.Replica``), trains from P through the base client's hooks
  (FedProx's anchor is P), uploads U_i = top-keep(y - P + e_i), scaled under the coordinator's norm bound when
  the task names one (``on_bounds``), and keeps e_i <- (y - P + e_i) - decode(U_i). Its
  first task carries no tensor: it rebuilds K_0 from the initial model it built at its welcome.
Float buffers (BatchNorm running statistics) are treated like weights; integer buffers travel dense with every
delta (the server takes the clients' lower median). Under a robust rule (Multi-Krum, centred clipping) each update
is combined on every coordinate (``shared_form``). Must not import a transport.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
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
    lacking,
    wrapper_config,
)
from fedge.algorithms.contract import BaseServer, WrappedClient
from fedge.algorithms.ef_meta import EfTask, EfUpdate
from fedge.algorithms.keyframes import PublicModel, Replica, float_layout, start_model
from fedge.algorithms.sparse import NO_GRID, FlatLayout, ValueGrid, compress
from fedge.codec import SparseSection, TensorGroup
from fedge.protocol.validation import Unfoldable

VALUE_DTYPES = ("f32", "f16", "bf16", "int8", "ternary", "quinary")


@dataclass(frozen=True)
class Config:
    base: Any = None
    keep: float = 0.1
    value_dtype: str = "f16"
    history: int = 8
    keyframe_ratio: float = 6.0
    keyframe_rounds: int = 15
    down_value_dtype: str = ""      # the coordinator's value encoding ("": value_dtype's)
    residual_decay: float = 0.5     # a device's residual is multiplied by this for each round its device sat out

    def __post_init__(self) -> None:
        if not self.down_value_dtype:
            object.__setattr__(self, "down_value_dtype", self.value_dtype)
        if self.down_value_dtype not in VALUE_DTYPES:
            raise ValueError(f"algorithm.down_value_dtype must be one of {VALUE_DTYPES}, got "
                             f"{self.down_value_dtype!r}")
        if not 0 <= self.residual_decay <= 1:
            raise ValueError(f"algorithm.residual_decay must lie in [0, 1], got {self.residual_decay}")
        if not 0 < self.keep <= 1:
            raise ValueError(f"algorithm.keep must lie in (0, 1], got {self.keep}")
        if self.value_dtype not in VALUE_DTYPES:
            raise ValueError(f"algorithm.value_dtype must be one of {VALUE_DTYPES}, got {self.value_dtype!r}")
        if isinstance(self.history, bool) or not isinstance(self.history, int) or self.history < 1:
            raise ValueError(f"algorithm.history must be an int >= 1, got {self.history!r}")
        if not 0 <= self.keyframe_ratio <= 1000:
            raise ValueError(f"algorithm.keyframe_ratio must lie in [0, 1000], got {self.keyframe_ratio}")
        if isinstance(self.keyframe_rounds, bool) or not isinstance(self.keyframe_rounds, int) or \
                self.keyframe_rounds < 0:
            raise ValueError(f"algorithm.keyframe_rounds must be an int >= 0, got {self.keyframe_rounds!r}")


def make_config(base_module: ModuleType, options: Mapping[str, Any]) -> Config:
    """ef's own options plus the base's (e.g. FedProx's mu); an option neither knows is an error."""
    return wrapper_config(Config, base_module, options)  # type: ignore[no-any-return]


def start_dtype(config: Config) -> str:
    return "f32" if config.down_value_dtype == "f32" else "f16"


class Server(BaseServer):
    """Keeps the public model (``keyframes.PublicModel``: keyframe, catch-up, history, what each client holds) and
    its own residual S - K, the part of its exact model S that the keyframe K lacks. In an asynchronous session an
    update trained from an older public model is folded too, as a change of S, under its staleness factors (its
    device keeps state: ``device_state``)."""

    device_state = True

    def __init__(self, config: Config, initial: Arrays, context: ServerContext, base_module: ModuleType) -> None:
        if base_module.Server is not fedavg.Server:
            raise ValueError(f"ef aggregates as FedAvg does (its server half replaces the base's): its base must "
                             f"have FedAvg's server half (fedavg, fedprox), not {base_module.__name__}'s")
        self.config = config
        self.context = context
        self.model = PublicModel(start_model(initial, start_dtype(config)), context.num_clients, config.history,
                                 config.down_value_dtype, start_dtype(config), config.keyframe_ratio, config.keyframe_rounds,
                                 context.initial_from_seed)
        self.layout = self.model.layout
        self.residual = np.zeros(self.layout.size, dtype=np.float32)
        self.folding: FlatMean | None = None  # the round being folded (not checkpointed: a round is redone whole)
        self.stale = 0                        # ... and its updates against an older public model

    @property
    def public(self) -> Arrays:
        return self.model.public

    def downlink(self, round_number: int, client_index: int) -> Payload:
        groups, meta = self.model.downlink(client_index)
        return Payload(groups=groups, meta=meta)

    def forget(self, client_index: int) -> None:
        """The next downlink to this client carries the keyframe dense (e.g. after it reported a lost replica)."""
        self.model.forget(client_index)

    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        """What ``fold`` needs of an update (or a reason): one ``update`` group whose sparse section covers the
        float tensors in the layout's order, the integer tensors dense, the public version it was trained from and
        the keyframe version its client holds."""
        integers = [name for name in self.public if name not in self.layout.names]
        problem = lacking(update.payload, {"update": integers}, sparse=True)
        if problem:
            return problem
        try:
            origin = EfUpdate.from_meta(update.payload.meta)
        except ValueError as exc:
            return str(exc)
        if not origin.keyframe <= origin.base <= self.model.version:
            return (f"meta.ef: base {origin.base} / keyframe {origin.keyframe}: not a version this coordinator has "
                    f"published (keyframe <= base <= {self.model.version})")
        section = update.payload.groups["update"].sparse
        problem = self.section_problem(round_number, section)
        if problem or section is None or section.kind != "indices":
            return problem
        most = codec.retained_count(section.size, keep=self.config.keep)
        if section.values.size > most:  # (a robust rule's or a private sum's change, folded, lies everywhere)
            return f"an ef update carries {section.values.size} values; keep = {self.config.keep} of {section.size} " \
                   f"allows {most}"
        return ""

    def section_problem(self, round_number: int, section: SparseSection | None) -> str:
        """Why an update's float values cannot be folded, or '': ef's are one indexed sparse section in the model's
        order, its indices in range, strictly increasing (sorted, each once) and one per value (a device's are at
        most keep x d: ``check_update``)."""
        if section is None or section.kind != "indices" or section.indices is None or \
                tuple(section.names) != self.layout.names or tuple(section.shapes) != self.layout.shapes:
            return "an ef update must carry the float tensors as one indexed sparse section, in the model's order"
        indices, size = section.indices, self.layout.size
        if indices.ndim != 1 or indices.size != section.values.size or indices.size != sum(section.counts):
            return f"an ef update carries {section.values.size} values at {indices.size} indices"
        if indices.size and (int(indices[0]) < 0 or int(indices[-1]) >= size or not bool((np.diff(indices) > 0).all())):
            return f"an ef update's indices must be strictly increasing (sorted, each once) and lie in [0, {size})"
        return ""

    def fold(self, round_number: int, update: ClientUpdate) -> None:
        """An update against the current public model joins the round's exact sums (``algorithms.accumulate``); a
        stale one only tells which keyframe its client holds, except in an asynchronous session, where it joins
        them too under the factors the coordinator set (``discount``, ``counted``: its version's staleness)."""
        origin = EfUpdate.from_meta(update.payload.meta)
        group = update.payload.groups["update"]
        problem = self.section_problem(round_number, group.sparse)
        if problem or group.sparse is None:  # checked before anything is kept: the fold takes all of it or nothing
            raise Unfoldable(problem)
        self.model.note_holds(update.index, origin.keyframe)
        if self.folding is None:
            self.folding, self.stale = FlatMean(self.layout.size), 0
        if origin.base != self.model.version and not self.context.asynchronous:
            self.stale += 1
            return
        self.folding.add(group.sparse.values, self.positions(round_number, group.sparse),
                         fedavg.fold_weight(update, self.config.base.weighting), group.dense, update.discount,
                         update.counted)

    def positions(self, round_number: int, section: SparseSection) -> np.ndarray:
        """The flat positions an update's values lie at: its own indices."""
        return section.positions()

    def shared_form(self, round_number: int, update: ClientUpdate) -> ClientUpdate | None:
        """For a robust rule: the update's values placed on every float coordinate (each device sends its own top
        coordinates, zero elsewhere), or None for an update against an older public model (folded as it is: it
        joins no sum)."""
        if EfUpdate.from_meta(update.payload.meta).base != self.model.version:
            return None
        group = update.payload.groups["update"]
        assert group.sparse is not None, "check_update admits only sparse ef updates"
        values = np.zeros(self.layout.size, dtype=np.float32)
        values[group.sparse.positions()] = group.sparse.values
        everywhere = SparseSection.with_indices(self.layout.names, self.layout.shapes,
                                                np.arange(self.layout.size, dtype=np.int64), values)
        shared = dataclasses.replace(group, sparse=everywhere)
        return dataclasses.replace(update, payload=Payload(groups={"update": shared}, meta=update.payload.meta))

    def close_round(self, round_number: int) -> dict[str, Any]:
        folding, self.folding = self.folding, None
        if folding is None or not folding.count:
            return {"ef_stale_updates": self.stale if folding is not None else 0,
                    "ef_dense_resyncs": self.model.take_resyncs()}
        merged = {name: value.astype(self.public[name].dtype) for name, value in folding.integers.medians().items()}
        exact = folding.mean().astype(np.float32) + self.residual  # S - K
        sent = compress(self.layout, exact, self.config.keep, self.config.down_value_dtype, dense=merged)
        keyframe = self.model.clock.due(self.reported(folding))
        self.residual = sent.residual if keyframe else exact
        self.model.publish(round_number, sent, merged, keyframe)
        behind, left = float(np.linalg.norm(exact)), float(np.linalg.norm(sent.residual))
        return {"ef_stale_updates": self.stale, "ef_dense_resyncs": self.model.take_resyncs(),
                "ef_keyframe": int(keyframe), "ef_sent_down": int(sent.indices.size),
                "ef_residual_norm": left, "ef_public_error": left / behind if behind else 0.0}


    def reported(self, folding: FlatMean) -> int:
        """How many devices' updates the round's sums hold (the keyframe clock's count): one per update folded."""
        return folding.count

    def evaluation_arrays(self) -> Arrays | None:
        """The coordinator's exact model S = K + residual (what the clients' updates made it; P approximates it)."""
        return {**self.public, **self.layout.split(self.layout.flat(self.model.key) + self.residual)}

    def state_dict(self) -> tuple[Arrays, dict[str, Any]]:
        arrays, meta = self.model.state_dict("")
        arrays["residual"] = self.residual
        return arrays, meta

    def load_state_dict(self, arrays: Arrays, meta: dict[str, Any]) -> None:
        self.model.load_state_dict(arrays, meta, "")
        self.residual = np.array(arrays["residual"], dtype=np.float32)


class Client(WrappedClient):
    """The base client training from the round's public model (``keyframes.Replica`` holds the keyframe), with its
    own residual as device state."""

    def __init__(self, config: Config, client_index: int, base_module: ModuleType) -> None:
        self.config = config
        self.base = base_module.Client(config.base, client_index)
        self.replica = Replica(start_dtype(config))
        self.start: Arrays = {}  # the public model this round trains from (P)
        self.start_version = 0   # ... and its version
        self.residual: np.ndarray | None = None
        self.residual_base: int | None = 0  # the public version the residual was left against (None: not known)
        self.clip = 0.0          # the coordinator's norm bound on this round's update (0: none known)
        self.grid = NO_GRID      # the grid the round's values are summed on (secure aggregation's; none by default)
        self.scale = 1.0         # ... and what the last update was scaled by to fit it

    def initial_model(self, arrays: Arrays) -> None:
        self.replica.initial = arrays

    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        task = EfTask.from_meta(payload.meta)
        self.start = self.replica.sync(payload.groups, task)
        self.start_version = task.version
        model_group = {MODEL_GROUP: TensorGroup(dense=self.start)}
        self.base.on_receive(round_number, Payload(groups=model_group), model)

    def on_bounds(self, round_number: int, norm_bounds: Mapping[str, float]) -> None:
        """The coordinator's bound on this round's ``update`` group: what is sent is clipped to it and the residual
        keeps the rest, so that an honest device's update is never scaled by the coordinator (and lost). The base
        half is not told: what it returns is the delta ef compresses, and only what is sent is clipped."""
        self.clip = float(norm_bounds.get("update", norm_bounds.get("*", 0.0)))

    def on_value_grid(self, round_number: int, bound: float, step: float) -> None:
        """Secure aggregation's grid clips each coordinate to ``bound`` and rounds it to ``step``: what is sent is
        clamped and rounded so already, and the residual keeps what that moved."""
        self.grid = ValueGrid(float(bound), float(step))

    def clip_scale(self) -> float:
        return self.scale

    def make_update(self, round_number: int, model: nn.Module, stats: LocalStats) -> Payload:
        payload: Payload = self.base.make_update(round_number, model, stats)
        is_model = MODEL_GROUP in payload.groups
        trained = dict(payload.groups[MODEL_GROUP if is_model else DELTA_GROUP].dense)
        layout = float_layout(self.start)
        delta = layout.flat(trained) - layout.flat(self.start) if is_model else layout.flat(trained)
        if self.residual is None or self.residual.size != layout.size:
            self.residual = np.zeros(layout.size, dtype=np.float32)
        # a residual saved before its version was kept (an older device state) is added whole, once
        missed = 0 if self.residual_base is None else self.start_version - self.residual_base - 1
        if missed > 0 and self.config.residual_decay != 1.0:
            self.residual = self.residual * np.float32(self.config.residual_decay ** missed)
        self.residual_base = self.start_version
        integers = {name: value for name, value in trained.items() if name not in layout.names}
        group, self.residual, self.scale = self.compressed(layout, delta + self.residual, integers)
        assert self.replica.version is not None, "make_update before on_receive"
        origin = EfUpdate(base=self.start_version, keyframe=self.replica.version)
        return Payload(groups={"update": group}, meta={**payload.meta, **origin.to_meta()})

    def compressed(self, layout: FlatLayout, update: np.ndarray, integers: Arrays
                   ) -> tuple[TensorGroup, np.ndarray, float]:
        """What is sent of ``update`` (the change with the residual): its top ``keep`` with indices, clipped under
        the task's bound; the new residual; the clip's scale."""
        sent = compress(layout, update, self.config.keep, self.config.value_dtype, dense=integers, clip=self.clip,
                        grid=self.grid)
        return sent.group, sent.residual, sent.scale

    def state_dict(self) -> Arrays:
        state = self.replica.state_dict()
        if self.residual is not None:
            state["ef/residual"] = self.residual
            if self.residual_base is not None:
                state["ef/residual_base"] = np.array(self.residual_base, dtype=np.int64)
        state.update(self.base.state_dict())
        return state

    def load_state_dict(self, state: Arrays) -> None:
        self.base.load_state_dict({k: v for k, v in state.items() if not k.startswith("ef/")})
        self.replica.load_state_dict(state)
        residual = state.get("ef/residual")
        self.residual = None if residual is None else np.array(residual, dtype=np.float32)
        self.residual_base = int(state["ef/residual_base"]) if "ef/residual_base" in state else \
            None if residual is not None else 0
