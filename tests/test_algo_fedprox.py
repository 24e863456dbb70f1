"""FedProx: the checks of docs/algorithms.md section 2."""

from __future__ import annotations

import torch

from fedge.algorithms import fedprox
from fedge.algorithms.base import Payload
from fedge.algorithms.loop import TrainSettings, train_local
from fedge.codec import TensorGroup
from fedge.models import build, state_to_arrays
from fedge.simulation.inprocess import global_arrays, make_fleet, run_round
from tests.algo_helpers import ADAM, TINY_MLP, client_data, same_arrays


def test_mu_zero_is_fedavg_bit_for_bit() -> None:
    data = client_data(TINY_MLP, 3)
    results = []
    for name, options in (("fedavg", {}), ("fedprox", {"mu": 0.0})):
        fleet = make_fleet(name, options, TINY_MLP, clients=3, seed=2)
        for round_number in (1, 2):
            run_round(fleet, round_number, data, ADAM, seed=2)
        results.append(global_arrays(fleet))
    assert same_arrays(*results)


def received(model: torch.nn.Module) -> Payload:
    return Payload(groups={"model": TensorGroup(dense=state_to_arrays(model))})


def test_extra_gradient_is_mu_times_distance_to_the_anchor() -> None:
    model = build(TINY_MLP)
    client = fedprox.Client(fedprox.Config(mu=0.3), 0)
    client.on_receive(1, received(model), model)
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    client.after_backward(model)
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, 0.3 * (p.detach() - anchor[name]))


def test_huge_mu_keeps_the_local_model_at_the_anchor() -> None:
    model = build(TINY_MLP)
    start = state_to_arrays(model)
    client = fedprox.Client(fedprox.Config(mu=1e4), 0)
    client.on_receive(1, received(model), model)
    x, y = client_data(TINY_MLP, 1)[0]
    train_local(model, client, x, y, TrainSettings(epochs=2, batch_size=8, lr=1e-5, optimizer="sgd"), seed=0)
    after = state_to_arrays(model)
    assert max(float(abs(after[k] - start[k]).max()) for k in start) < 1e-3


def test_anchor_is_the_received_model_not_the_previous_step() -> None:
    model = build(TINY_MLP)
    client = fedprox.Client(fedprox.Config(mu=1.0), 0)
    client.on_receive(1, received(model), model)
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = client_data(TINY_MLP, 1)[0]
    train_local(model, client, x, y, TrainSettings(epochs=1, batch_size=8, lr=0.1, optimizer="sgd"), seed=0)
    for name, p in model.named_parameters():
        assert torch.equal(client.anchor[name], anchor[name])
        assert not torch.equal(p.detach(), anchor[name])


def test_fedprox_differs_from_fedavg_when_mu_is_large() -> None:
    data = client_data(TINY_MLP, 2)
    results = []
    for name, options in (("fedavg", {}), ("fedprox", {"mu": 1.0})):
        fleet = make_fleet(name, options, TINY_MLP, clients=2, seed=1)
        run_round(fleet, 1, data, ADAM, seed=1)
        results.append(global_arrays(fleet))
    assert not same_arrays(*results)
