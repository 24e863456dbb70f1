"""FedBN (Li et al., ICLR 2021; docs/algorithms.md section 7): FedAvg in which every BatchNorm tensor stays on the device.

Holds one predicate (``is_local``: a tensor of a BatchNorm module, selected by module type, never by name) and
FedAvg's two halves filtered by it. The server keeps and averages the non-BN tensors only, so BN tensors are absent
from every downlink and are ignored if an upload carried one; the client strips them from every upload, keeps its
own BN (weight, bias, running statistics, num_batches_tracked) as device state (``state_dict``) and puts it back into
its model on every ``on_receive``, so after ``on_receive`` the model is this client's personal one: the shared
non-BN tensors plus its own BN. Must not import a transport.

Decisions where the papers are silent (docs/algorithms.md records them too):
- Options and defaults are FedAvg's: ``weighting = "samples"`` (section 0's default; the official code's uniform
  1/K is ``weighting = "uniform"``) and ``upload = "model" | "delta"``.
- A client without BN state (its first round, or a device whose state was never committed) resets its BN modules to
  their fixed initial values (weight 1, bias 0, mean 0, var 1, count 0), the same on every client as the paper
  requires, rather than keep what an uncommitted round left in the model.
- ``evaluation_arrays`` returns None when the model has BatchNorm (no global model exists: the server never holds BN
  tensors, so evaluation is per client with its own BN); without BN it is FedAvg's global model and FedBN runs
  exactly as FedAvg.
- The unseen-domain recipe of Appendix G needs the clients' BN affine parameters, which never leave the devices;
  it is not offered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedge.algorithms import fedavg
from fedge.algorithms.base import Arrays, LocalStats, Payload, ServerContext, load_into, model_arrays
from fedge.models import batch_norm_names

Config = fedavg.Config
Value = TypeVar("Value", bound=Any)


def is_local(name: str, batch_norm: Collection[str]) -> bool:
    """FedBN's whole rule: a tensor stays on the device iff it belongs to a BatchNorm module."""
    return name in batch_norm


def shared(arrays: Mapping[str, Value], batch_norm: Collection[str]) -> dict[str, Value]:
    """The tensors that are aggregated: everything but the local ones."""
    return {name: value for name, value in arrays.items() if not is_local(name, batch_norm)}


def without_local(payload: Payload, batch_norm: Collection[str]) -> Payload:
    """The payload with every local tensor removed from every group."""
    groups = {key: dataclasses.replace(group, dense=shared(group.dense, batch_norm))
              for key, group in payload.groups.items()}
    return Payload(groups=groups, meta=payload.meta)


def reset_batch_norm(model: nn.Module) -> None:
    """Every BatchNorm module back to its fixed initial values (weight 1, bias 0, mean 0, var 1, count 0)."""
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            module.reset_parameters()


class Server(fedavg.Server):
    """FedAvg's server over the shared (non-BN) tensors only."""

    def __init__(self, config: Config, initial: Arrays, context: ServerContext) -> None:
        self.local_names = frozenset(context.layout.batch_norm)
        super().__init__(config, shared(initial, self.local_names), context)

    def evaluation_arrays(self) -> Arrays | None:
        return None if self.local_names else self.model


class Client(fedavg.Client):
    """FedAvg's client that keeps its BN tensors: restored before the shared ones load, stripped from uploads."""

    def __init__(self, config: Config, client_index: int) -> None:
        super().__init__(config, client_index)
        self.batch_norm: Arrays = {}

    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        names = frozenset(batch_norm_names(model))
        if self.batch_norm:
            load_into(model, self.batch_norm)
        else:
            reset_batch_norm(model)
        super().on_receive(round_number, without_local(payload, names), model)
        # FedAvg's delta upload subtracts what was received; the BN part of it is dropped again in make_update.
        self.received.update({n: a for n, a in model_arrays(model).items() if n in names})

    def make_update(self, round_number: int, model: nn.Module, stats: LocalStats) -> Payload:
        names = frozenset(batch_norm_names(model))
        self.batch_norm = {n: a for n, a in model_arrays(model).items() if n in names}
        return without_local(super().make_update(round_number, model, stats), names)

    def state_dict(self) -> Arrays:
        return {name: array.copy() for name, array in self.batch_norm.items()}

    def load_state_dict(self, state: Arrays) -> None:
        self.batch_norm = {name: array.copy() for name, array in state.items()}
