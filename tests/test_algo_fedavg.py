"""FedAvg: the checks of docs/algorithms.md section 1, through real packets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedge.algorithms import fedavg
from fedge.algorithms.base import ClientUpdate, ModelLayout, Payload, ServerContext, weights_of
from fedge.algorithms.loop import round_seed, train_local
from fedge.codec import TensorGroup
from fedge.models import build, state_to_arrays
from fedge.protocol.server_half import aggregate_round
from fedge.simulation.inprocess import global_arrays, make_fleet, run_round
from tests.algo_helpers import ADAM, SGD, TINY_CNN_BN, TINY_MLP, client_data, max_difference, same_arrays


@pytest.mark.parametrize("settings", [SGD, ADAM], ids=["sgd", "adam"])
def test_one_client_global_model_is_its_local_run_bit_for_bit(settings) -> None:
    data = client_data(TINY_MLP, 1)
    fleet = make_fleet("fedavg", {}, TINY_MLP, clients=1, seed=3)
    reference = build(TINY_MLP)
    reference.load_state_dict(fleet.models[0].state_dict())
    run_round(fleet, 1, data, settings, seed=3)
    train_local(reference, fedavg.Client(fedavg.Config(), 0), *data[0], settings, round_seed(3, 1, 0))
    assert same_arrays(global_arrays(fleet), state_to_arrays(reference))


def test_identical_clients_aggregate_to_each_local_model() -> None:
    (x, y) = client_data(TINY_CNN_BN, 1)[0]
    fleet = make_fleet("fedavg", {}, TINY_CNN_BN, clients=2, seed=0)
    server = fleet.server
    updates = []
    for index in range(2):
        client, model = fleet.clients[index], fleet.models[index]
        client.on_receive(1, server.downlink(1, index), model)
        stats = train_local(model, client, x, y, SGD, seed=11)  # same data, seed and batch order
        updates.append(ClientUpdate(f"c{index}", index, 48, client.make_update(1, model, stats)))
    aggregate_round(server, 1, updates)
    assert same_arrays(state_to_arrays(fleet.models[0]), state_to_arrays(fleet.models[1]))
    assert same_arrays(global_arrays(fleet), state_to_arrays(fleet.models[0]))


def test_aggregation_is_the_sample_weighted_mean_and_integers_take_the_median() -> None:
    model = build(TINY_MLP)
    initial = state_to_arrays(model)
    context = ServerContext(num_clients=3, layout=ModelLayout.of(model))
    server = fedavg.Server(fedavg.Config(), initial, context)
    rng = np.random.default_rng(0)
    uploads = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in initial.items()} for _ in range(3)]
    sizes = [10, 30, 60]
    updates = [ClientUpdate(f"c{i}", i, n, Payload(groups={"model": TensorGroup(dense=u)}))
               for i, (u, n) in enumerate(zip(uploads, sizes, strict=True))]
    aggregate_round(server, 1, updates)
    for name in initial:
        expected = sum(n / 100 * u[name].astype(np.float64) for u, n in zip(uploads, sizes, strict=True))
        assert np.allclose(server.model[name], expected, atol=1e-6)
    weights = weights_of(updates, "samples")
    assert weights.sum() == pytest.approx(1.0) and list(weights) == [0.1, 0.3, 0.6]
    assert list(weights_of(updates, "uniform")) == [1 / 3] * 3
    ints = fedavg.average({"n": np.array(0)}, [{"n": np.array(4)}, {"n": np.array(9)}], weights[:2], False)
    assert int(ints["n"]) == 4 and ints["n"].dtype == np.array(0).dtype  # the lower median
    # one device's counter of 2^62 does not set the global one (it did when integers took the maximum)
    counted = {"counter": np.array(0, dtype=np.int64)}
    streamed = fedavg.Server(fedavg.Config(), {**initial, **counted}, context)
    claims = [np.array(5, dtype=np.int64), np.array(2**62, dtype=np.int64), np.array(7, dtype=np.int64)]
    aggregate_round(streamed, 1, [ClientUpdate(f"c{i}", i, 10, Payload(groups={"model": TensorGroup(
        dense={**uploads[i], "counter": claim})})) for i, claim in enumerate(claims)])
    assert int(streamed.model["counter"]) == 7


def test_uploading_models_or_deltas_gives_the_same_global_model() -> None:
    data = client_data(TINY_CNN_BN, 3)
    results = []
    for upload in ("model", "delta"):
        fleet = make_fleet("fedavg", {"upload": upload}, TINY_CNN_BN, clients=3, seed=5)
        run_round(fleet, 1, data, ADAM, seed=5)
        results.append(global_arrays(fleet))
    assert max_difference(*results) <= 1e-6


def test_unknown_option_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown option"):
        make_fleet("fedavg", {"mu": 0.1}, TINY_MLP, clients=1)


def test_training_changes_the_model() -> None:
    data = client_data(TINY_MLP, 2)
    fleet = make_fleet("fedavg", {}, TINY_MLP, clients=2)
    before = global_arrays(fleet)
    run_round(fleet, 1, data, SGD)
    assert not same_arrays(before, global_arrays(fleet))
    assert torch.is_grad_enabled()
