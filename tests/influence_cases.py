"""Uploads for the bounded-influence and robust-aggregation tests: a FedAvg server on the tiny MLP with honest
updates around its model, an attacker's inflated and flipped update, the distance between two models, and an ef
update of a device's own coordinates."""

from __future__ import annotations

import numpy as np

from fedge.algorithms import fedavg
from fedge.algorithms.base import ClientUpdate, ModelLayout, Payload, ServerContext
from fedge.codec import SparseSection, TensorGroup
from fedge.models import build, state_to_arrays
from tests.algo_helpers import TINY_MLP


def server_and_uploads(honest: int = 5, seed: int = 0) -> tuple[fedavg.Server, dict[str, np.ndarray],
                                                              list[ClientUpdate]]:
    model = build(TINY_MLP, seed=seed)
    initial = state_to_arrays(model)
    server = fedavg.Server(fedavg.Config(), initial, ServerContext(num_clients=honest + 1,
                                                                  layout=ModelLayout.of(model)))
    rng = np.random.default_rng(seed)
    updates = []
    for i in range(honest):
        moved = {k: (v + 0.01 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in initial.items()}
        updates.append(ClientUpdate(f"c{i}", i, 100 + 10 * i, Payload(groups={"model": TensorGroup(dense=moved)})))
    return server, initial, updates


def attacker(initial: dict[str, np.ndarray], index: int) -> ClientUpdate:
    flipped = {k: (-20 * v).astype(np.float32) for k, v in initial.items()}
    return ClientUpdate("evil", index, 10**9, Payload(groups={"model": TensorGroup(dense=flipped)}))


def distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum((a[k].astype(np.float64) - b[k]) ** 2) for k in a)))


def ef_update(server: object, index: int, base: int, rng: np.random.Generator, scale: float) -> ClientUpdate:
    """An ef update of the tiny MLP: the device's own top 30 % of coordinates, values of ``scale``."""
    from fedge.algorithms.ef_meta import EfUpdate

    layout = server.layout  # type: ignore[attr-defined]
    chosen = np.sort(rng.choice(layout.size, size=int(0.3 * layout.size), replace=False))
    values = (scale * rng.standard_normal(chosen.size)).astype(np.float32)
    section = SparseSection.with_indices(layout.names, layout.shapes, chosen, values)
    return ClientUpdate(f"c{index}", index, 100, Payload(groups={"update": TensorGroup(sparse=section)},
                                                         meta=EfUpdate(base=base, keyframe=0).to_meta()))
