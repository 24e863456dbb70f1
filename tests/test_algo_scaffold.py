"""SCAFFOLD: the checks of docs/algorithms.md section 3, plus device state and packet shape."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedge.algorithms import fedavg, scaffold
from fedge.algorithms.base import ClientUpdate, LocalStats, ModelLayout, ServerContext
from fedge.algorithms.loop import TrainSettings, round_seed
from fedge.algorithms.registry import REGISTRY, AlgorithmSpec
from fedge.client import round as client_round
from fedge.protocol.server_half import aggregate_round
from fedge.simulation.inprocess import Fleet, global_arrays, make_fleet, run_round, through_codec
from tests.algo_helpers import ADAM, SGD, TINY_MLP, client_data, max_difference


def test_scaffold_is_registered() -> None:
    assert REGISTRY["scaffold"] == AlgorithmSpec(scaffold)


def mean_own(fleet: Fleet) -> dict[str, np.ndarray]:
    names = fleet.server.control
    return {n: np.mean([np.asarray(c.own.get(n, np.zeros_like(names[n])), np.float64) for c in fleet.clients],
                       axis=0) for n in names}


@pytest.mark.parametrize("settings", [SGD, ADAM])
@pytest.mark.parametrize("correction", ["update", "gradient"])
def test_identical_clients_cancel_and_follow_fedavg(correction: str, settings: TrainSettings,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_round, "round_seed", lambda seed, round_number, index: round_seed(seed, round_number, 0))
    data = client_data(TINY_MLP, 1, samples=40) * 4  # identical data and (patched) identical batch order
    plain = make_fleet("fedavg", {"upload": "delta"}, TINY_MLP, clients=4, seed=4)
    fleet = make_fleet("scaffold", {"correction": correction}, TINY_MLP, clients=4, seed=4)
    for round_number in (1, 2, 3):
        run_round(plain, round_number, data, settings, seed=4)
        run_round(fleet, round_number, data, settings, seed=4)
        for client in fleet.clients:
            assert max_difference(client.own, fleet.server.control) == 0  # the correction is exactly zero
        assert max_difference(global_arrays(fleet), global_arrays(plain)) < 1e-6


@pytest.mark.parametrize("option", ["II", "I"])
def test_global_control_is_the_mean_of_all_client_controls_under_any_participation(option: str) -> None:
    data = client_data(TINY_MLP, 4, samples=24)
    fleet = make_fleet("scaffold", {"option": option}, TINY_MLP, clients=4, seed=1)
    for round_number, chosen in enumerate([[0, 1], [1, 3], [0], [2, 3], [3, 0, 1]], start=1):
        run_round(fleet, round_number, data, ADAM, seed=1, participants=chosen)
        assert max_difference(fleet.server.control, mean_own(fleet)) < 1e-6
    assert np.abs(np.concatenate([c.ravel() for c in fleet.server.control.values()])).max() > 1e-3


def test_round_one_equals_fedavg_with_unequal_clients() -> None:
    data = [client_data(TINY_MLP, 3, samples=n, seed=n)[i] for i, n in enumerate((16, 40, 24))]
    results = []
    for name in ("fedavg", "scaffold"):
        fleet = make_fleet(name, {}, TINY_MLP, clients=3, seed=5)
        run_round(fleet, 1, data, ADAM, seed=5)
        results.append(global_arrays(fleet))
    assert max_difference(*results) < 1e-6


def test_gradient_and_update_corrections_agree_under_plain_sgd() -> None:
    data = client_data(TINY_MLP, 3, samples=32)
    results = []
    for correction in ("update", "gradient"):
        fleet = make_fleet("scaffold", {"correction": correction}, TINY_MLP, clients=3, seed=2)
        for round_number in (1, 2, 3):
            run_round(fleet, round_number, data, SGD, seed=2)
        results.append(global_arrays(fleet))
    assert max_difference(*results) < 1e-5


class Scalar(nn.Module):
    """A 1-parameter float64 model for the quadratic toy."""

    def __init__(self) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.zeros(1, dtype=torch.float64))


def quadratic_run(name: str, rounds: int, config: Any) -> tuple[float, Any]:
    """f_i(x) = a_i (x - b_i)^2 / 2 with a = (1, 4), b = (1, -1); K = 10 GD steps of 0.05, full participation."""
    a, b, steps, lr = (1.0, 4.0), (1.0, -1.0), 10, 0.05
    module = scaffold if name == "scaffold" else fedavg
    initial = {"x": np.zeros(1, dtype=np.float64)}
    layout = ModelLayout(names=("x",), prunable=(), batch_norm=(), layers={"": ("x",)})
    server = module.Server(config, initial, ServerContext(num_clients=2, layout=layout))
    clients = [module.Client(config, i) for i in range(2)]
    models = [Scalar() for _ in clients]
    for round_number in range(1, rounds + 1):
        updates = []
        for i, (client, model) in enumerate(zip(clients, models, strict=True)):
            client.on_receive(round_number, server.downlink(round_number, i), model)
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            for _ in range(steps):
                optimizer.zero_grad()
                (a[i] * (model.x - b[i]) ** 2 / 2).sum().backward()
                client.after_backward(model)
                optimizer.step()
                client.after_step(model)
            up = client.make_update(round_number, model, LocalStats(steps=steps, samples=1, loss=0.0, lr=lr))
            updates.append(ClientUpdate(client_id=str(i), index=i, num_samples=1, payload=up))
        aggregate_round(server, round_number, updates)
    return float(server.model["x"][0]), server


def test_quadratic_fedavg_is_biased() -> None:
    x, _ = quadratic_run("fedavg", 200, fedavg.Config())
    assert abs(x - (-0.380)) < 1e-3
    assert abs(x - (-0.6)) == pytest.approx(0.22, abs=1e-2)


@pytest.mark.parametrize("correction", ["update", "gradient"])
def test_quadratic_scaffold_option_two_reaches_the_optimum(correction: str) -> None:
    x, server = quadratic_run("scaffold", 50, scaffold.Config(option="II", correction=correction, global_lr=1.0))
    assert abs(x - (-0.6)) < 1e-9
    assert abs(float(server.control["x"][0])) < 1e-8


def test_option_one_control_is_the_full_gradient_at_the_received_model() -> None:
    data = client_data(TINY_MLP, 2, samples=20)
    fleet = make_fleet("scaffold", {"option": "I"}, TINY_MLP, clients=2, seed=3)
    start = {n: torch.from_numpy(v.copy()) for n, v in global_arrays(fleet).items()}
    run_round(fleet, 1, data, ADAM, seed=3)
    model = fleet.models[1]
    model.load_state_dict(start)
    model.zero_grad()
    x, y = data[1]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for name, param in model.named_parameters():
        assert np.allclose(fleet.clients[1].own[name], param.grad.numpy(), atol=1e-6)


def test_client_control_survives_a_restart_bit_for_bit() -> None:
    data = client_data(TINY_MLP, 3, samples=24)
    runs = []
    for restart in (False, True):
        fleet = make_fleet("scaffold", {}, TINY_MLP, clients=3, seed=6)
        for round_number in (1, 2, 3, 4):
            if restart and round_number == 3:
                states = [client.state_dict() for client in fleet.clients]
                fleet.clients = [scaffold.Client(scaffold.Config(), i) for i in range(3)]
                for client, state in zip(fleet.clients, states, strict=True):
                    client.load_state_dict(state)
                arrays, meta = fleet.server.state_dict()
                fleet.server = scaffold.Server(scaffold.Config(), global_arrays(fleet), fleet.server.context)
                fleet.server.load_state_dict(arrays, meta)
            run_round(fleet, round_number, data, ADAM, seed=6, participants=[0, 2] if round_number == 2 else None)
        runs.append((global_arrays(fleet), fleet.server.control))
    assert max_difference(runs[0][0], runs[1][0]) == 0 and max_difference(runs[0][1], runs[1][1]) == 0


def test_packets_carry_model_and_control_both_ways() -> None:
    data = client_data(TINY_MLP, 2, samples=16)
    fleet = make_fleet("scaffold", {}, TINY_MLP, clients=2, seed=0)
    run_round(fleet, 1, data, ADAM, seed=0)
    down, _ = through_codec(fleet.server.downlink(2, 0), "task", 2)
    assert set(down.groups) == {"model", "control"} and down.meta["lr"] == ADAM.lr
    params = sum(p.numel() for p in fleet.models[0].parameters())
    assert sum(a.size for a in down.groups["control"].dense.values()) == params
    fleet.clients[0].on_receive(2, down, fleet.models[0])
    up = fleet.clients[0].make_update(2, fleet.models[0], LocalStats(steps=3, samples=16, loss=0.0, lr=1e-3))
    up, _ = through_codec(up, "update", 2)
    assert set(up.groups) == {"delta", "control"}
    assert sum(a.size for a in up.groups["control"].dense.values()) == params


def test_update_correction_without_before_training_uses_the_reported_lr() -> None:
    fleet = make_fleet("scaffold", {}, TINY_MLP, clients=2, seed=7)
    run_round(fleet, 1, client_data(TINY_MLP, 2, samples=16), ADAM, seed=7, participants=[0])
    late = scaffold.Client(scaffold.Config(), 1)  # never trained: no lr of its own, and no before_training
    down, _ = through_codec(fleet.server.downlink(2, 1), "task", 2)
    late.on_receive(2, down, fleet.models[1])
    assert late.difference and late.step_lr() == ADAM.lr
