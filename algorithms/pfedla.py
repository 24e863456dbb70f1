"""pFedLA and HeurpFedLA (Ma et al., CVPR 2022; docs/algorithms.md section 6): layer-wise personalised aggregation.

Server: keeps theta_j, every client's latest trained parameters (initialised from the initial model), and one
hypernetwork per client (``algorithms.hypernetwork``). For client i it sends theta_bar_i^l = sum_j alpha_i^{l,j}
theta_j^l per layer l, receives Delta theta_i for all layers, steps HN_i in the descent direction of
1/2 ||theta_bar_i - theta_i^trained||^2 (eta_hn = 5e-3 SGD; optionally guarded, ``max_alpha_change``) and stores theta_i <- theta_bar_i + Delta theta_i (in
float64, rounded to float32). There is no global model (``evaluation_arrays`` is None). ``state_dict`` holds theta
(one (N, ...) stack per tensor) and every hypernetwork's parameters: the coordinator's checkpoint, resumed bit for
bit. HeurpFedLA (``k`` > 0): the k layers with the largest normalised self-weight are retained: one-hot self,
detached, and not downloaded. Client: keeps its whole local model as device state (personal buffers and retained
layers live there), loads it, then the downlink, so after ``on_receive`` the model is its personalised theta_bar_i;
uploads trained - received for every parameter. Must not import a transport.

Decisions where the paper and its references are silent:
- A layer is a module of ``context.layout.layers`` (weight and bias share one alpha row); its aggregated tensors are
  its float tensors minus the BatchNorm buffers. Personal tensors (BN running statistics, num_batches_tracked, any
  non-float tensor) are never sent down or up; they stay on the device untouched (one-hot self by construction).
- The server tells BN buffers apart with the layout (``algorithms.base.learned_floats``); the client uses
  ``named_parameters``.
- A client that has never reported gets its retained layers too (from theta_i, the initial model): it has no local
  values of its own yet. From its second participation on they are absent from the downlink. A device without
  local state starts from fresh BN running statistics (mean 0, var 1, count 0), the same on every device.
- Retained layers: ties in self-weight go to the lower layer index; on the server theta_bar_i^l = theta_i^l, its
  stored copy. It equals the device's value because the agent falls back to its last committed state when an upload
  is not accepted (a device that kept an uncommitted round would differ until that layer is next downloaded).
- HN updates of a round all use the theta_j held when the round's downlinks were made; theta_i are stored after.
- Hypernetwork seeds derive from (context.seed, i). HeurpFedLA is this module with ``HeurConfig`` (k = 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

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
from fedge.algorithms.hypernetwork import HyperNetwork, descend, layer_weights, mix, weight_gradient
from fedge.codec import TensorGroup


@dataclass(frozen=True)
class Config:
    k: int = 0
    hn_lr: float = 5e-3
    embedding_dim: int = 100
    hidden_dim: int = 100
    max_alpha_change: float = 0.0  # the optional guard: 0 = off; docs/algorithms.md suggests 0.01

    def __post_init__(self) -> None:
        if self.k < 0 or self.hn_lr < 0 or self.embedding_dim < 1 or self.hidden_dim < 1:
            raise ValueError("algorithm.k and algorithm.hn_lr must be >= 0, embedding_dim and hidden_dim >= 1")
        if not 0 <= self.max_alpha_change <= 1:
            raise ValueError("algorithm.max_alpha_change must lie in [0, 1] (0: no guard)")


@dataclass(frozen=True)
class HeurConfig(Config):
    """HeurpFedLA's defaults: one retained layer (the paper's Tables 1-2)."""

    k: int = 1


class Server(HeldServer):
    """theta_j of every client, one hypernetwork per client, no global model."""

    def __init__(self, config: Config, initial: Arrays, context: ServerContext) -> None:
        self.config = config
        self.context = context
        layout = context.layout
        self.layers: list[tuple[str, list[str]]] = []
        learned = set(learned_floats(layout, initial))
        for module, names in layout.layers.items():
            own = [name for name in names if name in learned]
            if own:
                self.layers.append((module, own))
        if config.k > len(self.layers):
            raise ValueError(f"algorithm.k = {config.k} exceeds the model's {len(self.layers)} layers")
        count = context.num_clients
        self.theta: Arrays = {name: np.repeat(initial[name][None].astype(np.float32), count, axis=0)
                              for _, names in self.layers for name in names}
        self.networks = [HyperNetwork(count, len(self.layers), config.embedding_dim, config.hidden_dim,
                                      seed=context.seed * 1_000_003 + index) for index in range(count)]
        self.seen: set[int] = set()
        # For inspection (the eta_hn rule measures them): the alpha-gradient (L, N) of each client's latest HN step
        # and the factor the guard scaled that step by. Not state: not checkpointed.
        self.last_gradients: dict[int, np.ndarray] = {}
        self.last_step_scales: dict[int, float] = {}

    def weights(self, index: int) -> tuple[torch.Tensor, list[int]]:
        """alpha_i (with autograd) and the retained layer indices."""
        return layer_weights(self.networks[index], index, self.config.k)

    def aggregation_weights(self, index: int) -> np.ndarray:
        """alpha_i as a read-only float64 (L, N) array, rows in ``layer_names`` order (retained rows one-hot).

        For inspection (reproductions, reports); computing it changes nothing, not even autograd state.
        """
        with torch.no_grad():
            alpha, _ = self.weights(index)
        out = alpha.detach().numpy().astype(np.float64)
        out.setflags(write=False)
        return out

    @property
    def layer_names(self) -> list[str]:
        """The aggregation layers (modules), in the order of alpha's rows."""
        return [module for module, _ in self.layers]

    def personalised(self, index: int, alpha: np.ndarray, retained: Sequence[int]) -> Arrays:
        """theta_bar_i for every aggregated tensor (retained layers: the stored theta_i)."""
        result: Arrays = {}
        for row, (_, names) in enumerate(self.layers):
            for name in names:
                stack = self.theta[name]
                result[name] = stack[index].copy() if row in retained else mix(alpha[row], stack)
        return result

    def downlink(self, round_number: int, client_index: int) -> Payload:
        with torch.no_grad():
            alpha, retained = self.weights(client_index)
        model = self.personalised(client_index, alpha.detach().numpy(), retained)
        if client_index in self.seen:
            for row in retained:
                for name in self.layers[row][1]:
                    del model[name]
        meta = {"retained": [self.layers[row][0] for row in retained]}
        return Payload(groups={"model": TensorGroup(dense=model)}, meta=meta)

    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        """What ``fold`` needs of an update (or a reason): the delta of every aggregated tensor."""
        return lacking(update.payload, {"delta": self.theta})

    def aggregate_held(self, round_number: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        trained: dict[int, Arrays] = {}
        self_weights = []
        for update in updates:
            index = update.index
            delta = update.payload.groups["delta"].dense
            alpha, retained = self.weights(index)
            weights = alpha.detach().numpy()
            bar = self.personalised(index, weights, retained)
            trained[index] = {name: (bar[name].astype(np.float64) + np.asarray(delta[name], np.float64))
                              .astype(np.float32) for name in self.theta}
            stacks = [[self.theta[name] for name in names] for _, names in self.layers]
            residuals = [[-np.asarray(delta[name], np.float64) for name in names] for _, names in self.layers]
            gradient = weight_gradient(stacks, residuals)
            self.last_gradients[index] = gradient
            self.last_step_scales[index] = descend(self.networks[index], alpha, gradient, self.config.hn_lr,
                                                   self.config.max_alpha_change, index)
            self_weights.append(float(weights[:, index].mean()))
        for index, arrays in trained.items():
            for name, value in arrays.items():
                self.theta[name][index] = value
            self.seen.add(index)
        return {"alpha_self_mean": float(np.mean(self_weights))} if self_weights else {}

    def evaluation_arrays(self) -> Arrays | None:
        return None

    def state_dict(self) -> tuple[Arrays, dict[str, Any]]:
        arrays = {f"theta/{name}": stack.copy() for name, stack in self.theta.items()}
        for index, network in enumerate(self.networks):
            for name, tensor in network.state_dict().items():
                arrays[f"hn/{index}/{name}"] = tensor.detach().numpy().copy()
        return arrays, {"seen": sorted(self.seen)}

    def load_state_dict(self, arrays: Arrays, meta: dict[str, Any]) -> None:
        self.theta = {name: arrays[f"theta/{name}"].copy() for name in self.theta}
        for index, network in enumerate(self.networks):
            prefix = f"hn/{index}/"
            network.load_state_dict({k[len(prefix):]: torch.from_numpy(v.copy())
                                     for k, v in arrays.items() if k.startswith(prefix)})
        self.seen = {int(i) for i in meta.get("seen", [])}


class Client(BaseClient):
    """Loads its own local model, then the personalised downlink; uploads trained - received per parameter.
    Predictions on the device use its model after local training (``inference_after_training``)."""

    @property
    def inference_after_training(self) -> bool:
        return True

    def __init__(self, config: Config, client_index: int) -> None:
        self.config = config
        self.client_index = client_index
        self.local: Arrays = {}
        self.received: Arrays = {}

    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        if self.local:
            load_into(model, self.local)
        else:
            for module in model.modules():
                if isinstance(module, _BatchNorm):
                    module.reset_running_stats()
        load_into(model, payload.groups["model"].dense)
        arrays = model_arrays(model)
        self.received = {name: arrays[name] for name, _ in model.named_parameters()}

    def make_update(self, round_number: int, model: nn.Module, stats: LocalStats) -> Payload:
        self.local = model_arrays(model)
        delta = {name: self.local[name] - start for name, start in self.received.items()}
        return Payload(groups={"delta": TensorGroup(dense=delta)})

    def state_dict(self) -> Arrays:
        return {name: array.copy() for name, array in self.local.items()}

    def load_state_dict(self, state: Arrays) -> None:
        self.local = {name: array.copy() for name, array in state.items()}
