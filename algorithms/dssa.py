"""DSSA, dual-sided sparse aggregation (Zhao & Li; docs/algorithms.md sections 4 and 10): a wrapper over a base algorithm.

One module for every base (fedavg, fedprox, scaffold): the registry passes the base module. Rounds 1..W
(``warmup_rounds``) are the base algorithm untouched. A sparse round t > W:
- Server: the mask M keeps the k = N_w - floor(p N_w) largest |w| over all prunable tensors (``layout.prunable``,
  global, ties by flat index), recomputed from the dense global model; pruning is destructive. Downlink: the base's
  "model" group with its prunable tensors as retained values + mask (``SparseSection.with_mask``); every other group
  (SCAFFOLD's "control") as its complement values only (c[T]); non-prunable tensors dense.
- Client: rebuilds the base's dense payload (zeros where nothing was sent), lets the base client train it, zeroes
  the retained gradients after every backward pass and restores the retained weights bit for bit after every step.
  Uplink: every group's complement values without indices (``masked_values``, bound to the mask CRC), non-prunable
  tensors dense. With ``uplink_keep`` sigma < 1 the update group sends the top sigma of its complement update with
  indices and keeps the rest as an error-feedback residual (device state).
- Server: the base aggregates the densified updates around the pruned model (non-prunable tensors, control
  variates, integer buffers: no lambda); then the wrapper sets w[M] = w~[M] and w[C] = lambda sum_i p_i dw_i[C].

Decisions where the papers are silent (docs/algorithms.md records them too):
- Group convention (``algorithms.base``): the base's ``MODEL_GROUP`` holds the model; ``MODEL_GROUP`` or
  ``DELTA_GROUP`` is the update group; any other group holds quantities of the trainable set T (control variates
  and their deltas). A base server is a ``GlobalModelServer`` (``global_model`` / ``set_global_model``); a base
  client that keeps per-coordinate state overrides ``freeze(masks)`` (SCAFFOLD does), so c_i stays untouched on
  retained coordinates.
- ``value_dtype`` (f32 | f16 | bf16 | int8) applies to the sparse rounds' packets only; warm-up rounds are the base's.
  With a lossy dtype the server's pruned model is the model as the clients decode it, so both sides agree bit for
  bit on the retained weights, and aggregation is around what the clients actually received.
- The uplink residual covers all N_w prunable coordinates: u = dw[C] + r[C] competes for the top sigma |C|, r keeps
  u - decoded(sent) on C (the quantisation error too) and is left as it is on retained coordinates, which return to
  the complement in a later round. With sigma = 1 no residual exists.
- ``pruned_evaluation_arrays()``: the pruned form w~ of the current global model, i.e. exactly what the next sparse
  round transmits (after the last round: the final model at sparsity p); None while the next round is a warm-up.
  ``close_round`` returns ``dssa_*`` metrics (phase, k, N_w, the norm of the complement aggregate).
Must not import a transport.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import nn

from fedge import codec
from fedge.algorithms.accumulate import FlatMean
from fedge.algorithms.base import (
    MODEL_GROUP,
    UPDATE_GROUPS,
    Arrays,
    ClientUpdate,
    LocalStats,
    Payload,
    ServerContext,
    wrapper_config,
)
from fedge.algorithms.contract import WrappedClient, WrappedServer
from fedge.algorithms.fedavg import fold_weight
from fedge.algorithms.sparse import FlatLayout, compress, decoded
from fedge.codec import SparseSection, TensorGroup
from fedge.protocol.server_half import GlobalModelServer
from fedge.protocol.validation import Unfoldable

VALUE_DTYPES = ("f32", "f16", "bf16", "int8")


@dataclass(frozen=True)
class Config:
    base: Any = None
    sparsity: float = 0.5
    scale: float = 1.5
    warmup_rounds: int = 5
    value_dtype: str = "f32"
    uplink_keep: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.sparsity < 1:
            raise ValueError(f"algorithm.sparsity (fraction pruned) must lie in (0, 1), got {self.sparsity}")
        if not self.scale > 0:
            raise ValueError(f"algorithm.scale (lambda) must be > 0, got {self.scale}")
        if isinstance(self.warmup_rounds, bool) or not isinstance(self.warmup_rounds, int) or self.warmup_rounds < 0:
            raise ValueError(f"algorithm.warmup_rounds must be an int >= 0, got {self.warmup_rounds!r}")
        if self.value_dtype not in VALUE_DTYPES:
            raise ValueError(f"algorithm.value_dtype must be one of {VALUE_DTYPES}, got {self.value_dtype!r}")
        if not 0 < self.uplink_keep <= 1:
            raise ValueError(f"algorithm.uplink_keep must lie in (0, 1], got {self.uplink_keep}")


def make_config(base_module: ModuleType, options: Mapping[str, Any]) -> Config:
    """DSSA's own options plus the base's (e.g. FedProx's mu); an option neither knows is an error."""
    return wrapper_config(Config, base_module, options)  # type: ignore[no-any-return]


def retained_mask(arrays: Mapping[str, np.ndarray], layout: FlatLayout, sparsity: float) -> np.ndarray:
    """M: True on the k = N_w - floor(p N_w) largest |w| over all prunable tensors, ties by flat index."""
    count = codec.retained_count(layout.size, sparsity=sparsity)
    return codec.topk_mask([arrays[name] for name in layout.names], count)


def split_group(layout: FlatLayout, arrays: Mapping[str, np.ndarray], mask: np.ndarray, retained: bool,
                value_dtype: str) -> TensorGroup:
    """Prunable tensors as retained values + mask (``retained``) or as complement values only; the rest dense."""
    flat = layout.flat(arrays)
    rest = {name: value for name, value in arrays.items() if name not in layout.names}
    if retained:
        section = SparseSection.with_mask(layout.names, layout.shapes, mask, np.compress(mask, flat))
    else:
        section = SparseSection.masked_values(layout.names, layout.shapes, mask, np.compress(~mask, flat))
    return TensorGroup(dense=rest, sparse=section, value_dtype=value_dtype)


def group_arrays(group: TensorGroup, mask: np.ndarray) -> Arrays:
    """Every tensor of a DSSA group as a dense array, zero where the group carries no value."""
    arrays = {name: np.array(value, copy=True) for name, value in group.dense.items()}
    if group.sparse is not None:
        if group.sparse.kind == "indices" and mask[group.sparse.positions()].any():
            raise Unfoldable("a DSSA update carries values at retained coordinates")
        arrays.update(group.sparse.to_dense(reference_mask=mask))
    return arrays


class Server(WrappedServer):
    """The base's server half, with the mask, the pruning and the lambda-scaled complement around it."""

    base: GlobalModelServer

    def __init__(self, config: Config, initial: Arrays, context: ServerContext, base_module: ModuleType) -> None:
        self.config = config
        self.base = base_module.Server(config.base, initial, context)
        self.layout = FlatLayout.of(initial, context.layout.prunable)
        self.last_round = 0
        self.complement: FlatMean | None = None  # the sparse round being folded: its complement coordinates
        self.cached: tuple[int, np.ndarray, Arrays] | None = None

    def is_sparse(self, round_number: int) -> bool:
        return round_number > self.config.warmup_rounds

    def prune(self, model: Arrays) -> tuple[np.ndarray, Arrays]:
        """The mask of a dense model and its pruned form w~ exactly as the clients decode it."""
        mask = retained_mask(model, self.layout, self.config.sparsity)
        group = decoded(split_group(self.layout, model, mask, True, self.config.value_dtype))
        arrays = group_arrays(group, mask)
        return mask, {name: arrays[name] for name in model}

    def round_state(self, round_number: int) -> tuple[np.ndarray, Arrays]:
        """This round's mask and pruned model, computed once from the dense model at the start of the round."""
        if self.cached is None or self.cached[0] != round_number:
            self.cached = (round_number, *self.prune(self.base.global_model()))
        return self.cached[1], self.cached[2]

    def downlink(self, round_number: int, client_index: int) -> Payload:
        payload: Payload = self.base.downlink(round_number, client_index)
        if not self.is_sparse(round_number):
            return payload
        mask, _ = self.round_state(round_number)
        groups = {name: split_group(self.layout, group.dense, mask, name == MODEL_GROUP, self.config.value_dtype)
                  for name, group in payload.groups.items()}
        return Payload(groups=groups, meta=payload.meta)

    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        """In a warm-up round the base's rule. In a sparse round every group densified as ``fold`` will
        (values bound to this round's mask, no indexed value at a retained coordinate), then the base's rule on
        what the base's fold will see."""
        if not self.is_sparse(round_number):
            return self.base.check_update(round_number, update)
        mask, _ = self.round_state(round_number)
        groups = {}
        for name, group in update.payload.groups.items():
            section = group.sparse
            if section is not None and (tuple(section.names) != self.layout.names or
                                        tuple(section.shapes) != self.layout.shapes):
                return f"group {name!r}: its sparse section is not over the prunable tensors"
            if section is not None and not (section.kind == "masked-values" and not section.select or
                                            section.kind == "indices" and section.indices is not None and
                                            section.indices.size == section.values.size):
                return f"group {name!r}: a DSSA update carries its values on this round's complement (values bound " \
                       "to the mask, or indexed there)"
            try:
                groups[name] = TensorGroup(dense=group_arrays(group, mask))
            except (ValueError, codec.CodecError) as exc:
                return f"group {name!r}: {exc}"
        return self.base.check_update(round_number, dataclasses.replace(update, payload=Payload(groups,
                                                                                                update.payload.meta)))

    def fold(self, round_number: int, update: ClientUpdate) -> None:
        """In a sparse round: the update densified (the pruned model at the retained coordinates of a model
        upload), its complement coordinates into the round's exact weighted sums, and the dense update folded
        into the base's; in a warm-up round, the base's fold."""
        if not self.is_sparse(round_number):
            self.base.fold(round_number, update)
            return
        mask, pruned = self.round_state(round_number)
        dense = {name: group_arrays(group, mask) for name, group in update.payload.groups.items()}  # before any sum
        if self.complement is None:
            self.complement = FlatMean(int(np.count_nonzero(~mask)))
        weight = fold_weight(update, self.config.base.weighting)
        pruned_flat = self.layout.flat(pruned)
        groups = {}
        for name, arrays in dense.items():
            if name in UPDATE_GROUPS:
                flat = self.layout.flat(arrays)
                self.complement.add(flat[~mask], None, weight)
                if name == MODEL_GROUP:
                    arrays.update(self.layout.split(np.where(mask, pruned_flat, flat)))
            groups[name] = TensorGroup(dense=arrays)
        self.base.fold(round_number, dataclasses.replace(update, payload=Payload(groups, update.payload.meta)))

    def close_round(self, round_number: int) -> dict[str, Any]:
        self.last_round = round_number
        if not self.is_sparse(round_number):
            return {**self.base.close_round(round_number), "dssa_sparse": 0}
        complement, self.complement = self.complement, None
        mask, pruned = self.round_state(round_number)
        self.base.set_global_model(dict(pruned))
        metrics = dict(self.base.close_round(round_number))
        pruned_flat = self.layout.flat(pruned)
        if complement is not None and complement.count:
            pruned_flat[~mask] = (self.config.scale * complement.mean()).astype(np.float32)
        scaled = pruned_flat[~mask]
        self.base.set_global_model({**self.base.global_model(), **self.layout.split(pruned_flat)})
        return {**metrics, "dssa_sparse": 1, "dssa_retained": int(np.count_nonzero(mask)),
                "dssa_prunable": self.layout.size, "dssa_complement_norm": float(np.linalg.norm(scaled))}


    def influence_phase(self, round_number: int) -> str:
        return "sparse" if self.is_sparse(round_number) else "dense"  # a sparse round's updates differ in scale

    def pruned_evaluation_arrays(self) -> Arrays | None:
        """w~ of the current global model (what the next sparse round transmits); None while warm-up continues."""
        if not self.is_sparse(self.last_round + 1):
            return None
        return self.prune(self.base.global_model())[1]

    def state_dict(self) -> tuple[Arrays, dict[str, Any]]:
        arrays, meta = self.base.state_dict()
        return arrays, {"base": meta, "last_round": self.last_round}

    def load_state_dict(self, arrays: Arrays, meta: dict[str, Any]) -> None:
        self.base.load_state_dict(arrays, dict(meta.get("base", {})))
        self.last_round = int(meta.get("last_round", 0))
        self.cached = None


class Client(WrappedClient):
    """The base's client half, with the retained weights frozen and the uplink restricted to the complement."""

    def __init__(self, config: Config, client_index: int, base_module: ModuleType) -> None:
        self.config = config
        self.base = base_module.Client(config.base, client_index)
        self.mask: np.ndarray | None = None
        self.layout = FlatLayout((), ())
        self.frozen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.residual: np.ndarray | None = None

    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        section = payload.groups[MODEL_GROUP].sparse
        self.mask, self.frozen = None, []
        if section is None:
            self.base.on_receive(round_number, payload, model)
            return
        self.layout = FlatLayout(section.names, section.shapes)
        self.mask = np.asarray(section.mask, dtype=bool)
        groups = {name: TensorGroup(dense=group_arrays(group, self.mask)) for name, group in payload.groups.items()}
        self.base.on_receive(round_number, Payload(groups=groups, meta=payload.meta), model)
        masks = self.layout.parts(self.mask)
        params = dict(model.named_parameters())
        self.frozen = [(params[name], torch.from_numpy(masks[name].copy()), params[name].detach().clone())
                       for name in self.layout.names]
        self.base.freeze(masks)

    def after_backward(self, model: nn.Module) -> None:
        self.base.after_backward(model)
        with torch.no_grad():
            for param, retained, _ in self.frozen:
                if param.grad is not None:
                    param.grad.masked_fill_(retained, 0.0)

    def after_step(self, model: nn.Module) -> None:
        self.base.after_step(model)
        with torch.no_grad():
            for param, retained, values in self.frozen:
                param.copy_(torch.where(retained, values, param))

    def trainable_masks(self) -> dict[str, np.ndarray] | None:
        """For the meter: True where a prunable weight is trainable this round (the complement); None in dense
        rounds. Parameters not named here are trainable in full."""
        if self.mask is None:
            return None
        return {name: ~retained for name, retained in self.layout.parts(self.mask).items()}

    def make_update(self, round_number: int, model: nn.Module, stats: LocalStats) -> Payload:
        payload: Payload = self.base.make_update(round_number, model, stats)
        if self.mask is None:
            return payload
        groups = {name: self.uplink_group(name, group, self.mask) for name, group in payload.groups.items()}
        return Payload(groups=groups, meta=payload.meta)

    def uplink_group(self, name: str, group: TensorGroup, mask: np.ndarray) -> TensorGroup:
        arrays = dict(group.dense)
        if name not in UPDATE_GROUPS or self.config.uplink_keep >= 1:
            return split_group(self.layout, arrays, mask, False, self.config.value_dtype)
        if self.residual is None or self.residual.size != self.layout.size:
            self.residual = np.zeros(self.layout.size, dtype=np.float32)
        delta = np.where(mask, np.float32(0), self.layout.flat(arrays))
        rest = {n: value for n, value in arrays.items() if n not in self.layout.names}
        sent = compress(self.layout, delta + self.residual, self.config.uplink_keep, self.config.value_dtype,
                        dense=rest, candidates=np.flatnonzero(~mask))
        self.residual = sent.residual
        return sent.group

    def state_dict(self) -> Arrays:
        state: Arrays = dict(self.base.state_dict())
        if self.residual is not None:
            state["dssa/residual"] = self.residual
        return state

    def load_state_dict(self, state: Arrays) -> None:
        self.base.load_state_dict({k: v for k, v in state.items() if not k.startswith("dssa/")})
        residual = state.get("dssa/residual")
        self.residual = None if residual is None else np.array(residual, dtype=np.float32)
