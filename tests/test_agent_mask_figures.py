"""The agent's mask figures for the meter: DSSA's claim counts exactly its trainable elements; dense algorithms
have none."""

from __future__ import annotations

from fedge.client.metering import mask_figures
from fedge.simulation.inprocess import make_fleet, run_round
from tests.algo_helpers import ADAM, TINY_MLP, client_data


def test_dssa_claims_its_complement_and_dense_algorithms_claim_nothing() -> None:
    data = client_data(TINY_MLP, 2)
    fleet = make_fleet("dssa-fedavg", {"warmup_rounds": 1, "sparsity": 0.5}, TINY_MLP, clients=2)
    run_round(fleet, 1, data, ADAM)
    assert mask_figures(fleet.clients[0], fleet.models[0]) == (None, None)  # warm-up: dense
    run_round(fleet, 2, data, ADAM)
    claim, densities = mask_figures(fleet.clients[0], fleet.models[0])
    params = dict(fleet.models[0].named_parameters())
    weights = sum(params[n].numel() for n in ("fc1.weight", "fc2.weight", "fc3.weight"))
    others = sum(p.numel() for n, p in params.items() if not n.endswith("weight"))
    assert claim == weights // 2 + others  # p = 0.5 of the weights trainable, biases in full
    assert densities is not None and set(densities) == {"fc1.weight", "fc2.weight", "fc3.weight"}
    assert all(0.0 <= d <= 1.0 for d in densities.values())
    dense = make_fleet("fedavg", {}, TINY_MLP, clients=1)
    assert mask_figures(dense.clients[0], dense.models[0]) == (None, None)
