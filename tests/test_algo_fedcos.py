"""fedcos (docs/algorithms.md section 9, checks 1-5, plus its device state, warm start, selection and 8-bit uploads)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedge import codec
from fedge.algorithms import fedavg, fedcos, registry
from fedge.algorithms.base import ClientUpdate, ModelLayout, Payload, ServerContext
from fedge.algorithms.loop import TrainSettings, train_local
from fedge.models import ModelSpec, build, state_to_arrays
from fedge.protocol.server_half import aggregate_round
from fedge.simulation import inprocess

MLP = ModelSpec(name="mlp", input_shape=(1, 8, 8), num_classes=4)
SGD = TrainSettings(epochs=1, batch_size=16, lr=0.05, optimizer="sgd")
FULL_BATCH = TrainSettings(epochs=1, batch_size=1000, lr=0.05, optimizer="sgd")


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(registry.REGISTRY, "fedcos", registry.AlgorithmSpec(fedcos))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def client_data(count: int, size: int = 48, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 1, 8, 8, generator=generator), torch.randint(0, 4, (size,), generator=generator))
            for _ in range(count)]


def make_server(clients: int = 4, **options: object) -> fedcos.Server:
    torch.manual_seed(0)
    model = build(MLP)
    context = ServerContext(num_clients=clients, layout=ModelLayout.of(model), seed=0)
    return registry.make_server("fedcos", options, state_to_arrays(model), context)


def update(index: int, delta: dict[str, np.ndarray], size: int = 10) -> ClientUpdate:
    return ClientUpdate(f"c{index}", index, size, Payload(groups={"delta": codec.TensorGroup(dense=delta)}))


def random_delta(server: fedcos.Server, seed: int, scale: float = 0.01) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: (scale * rng.normal(size=v.shape)).astype(np.float32) for n, v in server.model.items()}


def weights_of(metrics: dict, count: int) -> np.ndarray:
    return np.array([metrics["cos_weights"][f"c{i}"] for i in range(count)])


def test_identical_clients_get_equal_weights_and_reproduce_uniform_fedavg() -> None:
    server = make_server()
    delta = random_delta(server, 0)
    initial = copy.deepcopy(server.model)
    metrics = aggregate_round(server, 1, [update(i, delta, size=10 * (i + 1)) for i in range(3)])
    assert np.array_equal(weights_of(metrics, 3), np.full(3, 1 / 3))
    reference = fedavg.Server(fedavg.Config(weighting="uniform", upload="delta"), initial, server.context)
    aggregate_round(reference, 1, [update(i, delta, size=10 * (i + 1)) for i in range(3)])
    assert all(np.array_equal(server.model[n], reference.model[n]) for n in reference.model)


def test_temperature_limits() -> None:
    server = make_server()
    deltas = [random_delta(server, seed) for seed in range(3)]
    deltas[1] = {n: deltas[0][n] + 0.2 * v for n, v in deltas[1].items()}
    hot = fedcos.cosine_weights([np.concatenate([d[n].ravel() for n in server.cos_names]) for d in deltas],
                                [10, 10, 10], tau=float("inf"))[0]
    assert np.array_equal(hot, np.full(3, 1 / 3))
    assert np.allclose(weights_of(aggregate_round(make_server(tau=1e6), 1, [update(i, d) for i, d in enumerate(deltas)]), 3),
                       1 / 3, atol=1e-6)
    cold = weights_of(aggregate_round(make_server(tau=1e-6), 1, [update(i, d) for i, d in enumerate(deltas)]), 3)
    flat = [np.concatenate([d[n].ravel() for n in server.cos_names]).astype(np.float64) for d in deltas]
    direction = sum(flat) / 3
    cosines = [f @ direction / np.linalg.norm(f) / np.linalg.norm(direction) for f in flat]
    assert np.allclose(cold, np.eye(3)[int(np.argmax(cosines))], atol=1e-9)


def test_a_zero_update_is_left_out_and_the_rest_still_sum_to_one() -> None:
    server, alone = make_server(), make_server()
    deltas = [random_delta(server, seed) for seed in range(3)]
    zero = {n: np.zeros_like(v) for n, v in deltas[0].items()}
    metrics = aggregate_round(server, 1, [update(0, deltas[0]), update(1, zero), update(2, deltas[2])])
    weights = weights_of(metrics, 3)
    assert metrics["cos_excluded"] == 1 and weights[1] == 0.0
    assert abs(weights.sum() - 1.0) < 1e-12
    aggregate_round(alone, 1, [update(0, deltas[0]), update(2, deltas[2])])
    assert all(np.array_equal(server.model[n], alone.model[n]) for n in server.model)
    tiny = {n: np.full_like(v, 1e-12) for n, v in zero.items()}
    before = copy.deepcopy(server.model)
    assert aggregate_round(server, 2, [update(0, tiny)])["cos_excluded"] == 1
    assert all(np.array_equal(server.model[n], before[n]) for n in before)


def test_an_opposing_client_gets_the_smallest_weight() -> None:
    server = make_server()
    common = random_delta(server, 0)
    deltas = [{n: v + random_delta(server, seed, 0.004)[n] for n, v in common.items()} for seed in range(1, 4)]
    deltas.append({n: -v for n, v in common.items()})
    weights = weights_of(aggregate_round(server, 1, [update(i, d) for i, d in enumerate(deltas)]), 4)
    assert int(np.argmin(weights)) == 3 and weights[3] < 0.5 * weights[:3].min()
    assert abs(weights.sum() - 1) < 1e-12


def test_cos_layers_restricts_the_cosine_to_the_last_layers() -> None:
    server = make_server(cos_layers=1)
    assert server.cos_names == ["fc3.weight", "fc3.bias"]
    base = random_delta(server, 0)
    deltas = [{n: (v if n.startswith("fc3") else random_delta(server, seed)[n]) for n, v in base.items()}
              for seed in range(3)]
    assert np.array_equal(weights_of(aggregate_round(server, 1, [update(i, d) for i, d in enumerate(deltas)]), 3),
                          np.full(3, 1 / 3))
    everything = weights_of(aggregate_round(make_server(), 1, [update(i, d) for i, d in enumerate(deltas)]), 3)
    assert not np.allclose(everything, 1 / 3, atol=1e-4)


def test_zero_rate_and_zero_c_is_plain_local_sgd() -> None:
    data = client_data(2)
    models = {}
    for name, options in (("fedavg", {}), ("fedcos", {"eta_c": 0.0})):
        fleet = inprocess.make_fleet(name, options, MLP, clients=2, seed=1)
        inprocess.run_round(fleet, 1, data, SGD, seed=1)
        models[name] = [state_to_arrays(m) for m in fleet.models]
        if name == "fedcos":
            assert all(not c.any() for c in fleet.clients[0].c.values())
    for a, b in zip(models["fedavg"], models["fedcos"], strict=True):
        assert all(np.array_equal(a[n], b[n]) for n in a)


def test_one_drift_corrected_step_by_hand() -> None:
    inputs, labels = client_data(1, size=20)[0]
    model = build(MLP)
    client = registry.make_client("fedcos", {"eta_c": 0.3}, 0)
    client.load_state_dict({f"c/{n}": np.full(p.shape, 0.01, np.float32) for n, p in model.named_parameters()})
    client.on_receive(1, Payload(groups={"model": codec.TensorGroup(dense=state_to_arrays(model))}), model)
    start = copy.deepcopy(model)
    F.cross_entropy(start(inputs), labels).backward()
    train_local(model, client, inputs, labels, FULL_BATCH, seed=0)
    for name, parameter in start.named_parameters():
        gradient = parameter.grad
        expected = parameter.detach() - 0.05 * (gradient - 0.01)
        assert torch.allclose(dict(model.named_parameters())[name], expected, atol=1e-6)
        assert torch.allclose(client.c[name], 0.01 + 0.3 * (gradient - 0.01), atol=1e-7)


def test_c_persists_across_rounds_and_restarts_unless_reset() -> None:
    data = client_data(2, seed=2)
    fleet = inprocess.make_fleet("fedcos", {"eta_c": 0.05, "sample_rate": 1.0}, MLP, clients=2, seed=2)
    inprocess.run_round(fleet, 1, data, SGD, seed=2)
    state = fleet.clients[0].state_dict()
    assert int(state["rounds"]) == 1 and any(np.abs(v).max() > 0 for k, v in state.items() if k.startswith("c/"))
    restarted = registry.make_client("fedcos", {"eta_c": 0.05}, 0)
    restarted.load_state_dict(state)
    restarted.on_receive(2, fleet.server.downlink(2, 0), copy.deepcopy(fleet.models[0]))
    assert all(torch.equal(restarted.c[n[2:]], torch.from_numpy(v)) for n, v in state.items() if n.startswith("c/"))
    reset = registry.make_client("fedcos", {"eta_c": 0.05, "reset_each_round": True}, 0)
    reset.load_state_dict(state)
    reset.on_receive(2, fleet.server.downlink(2, 0), copy.deepcopy(fleet.models[0]))
    assert all(not c.any() for c in reset.c.values())


def test_cv_every_updates_c_on_every_kth_participation() -> None:
    data = client_data(1, seed=3)
    fleet = inprocess.make_fleet("fedcos", {"eta_c": 0.05, "cv_every": 3, "sample_rate": 1.0}, MLP, clients=1)
    history = []
    for round_number in range(1, 6):
        inprocess.run_round(fleet, round_number, data, SGD)
        history.append({n: c.clone() for n, c in fleet.clients[0].c.items()})
    changed = [not all(torch.equal(a[n], b[n]) for n in a) for a, b in zip(history, history[1:], strict=False)]
    assert changed == [False, False, True, False]


def test_the_learning_rate_is_the_default_rate() -> None:
    inputs, labels = client_data(1, size=20)[0]
    model = build(MLP)
    client = registry.make_client("fedcos", {}, 0)
    client.on_receive(1, Payload(groups={"model": codec.TensorGroup(dense=state_to_arrays(model))}), model)
    explicit = registry.make_client("fedcos", {"eta_c": FULL_BATCH.lr}, 0)
    explicit.on_receive(1, Payload(groups={"model": codec.TensorGroup(dense=state_to_arrays(model))}), model)
    train_local(copy.deepcopy(model), client, inputs, labels, FULL_BATCH, seed=0)
    train_local(copy.deepcopy(model), explicit, inputs, labels, FULL_BATCH, seed=0)
    assert all(torch.equal(client.c[n], explicit.c[n]) for n in client.c)


def test_warm_start_sends_the_mean_gradient_as_everyones_initial_c() -> None:
    data = client_data(3, size=24, seed=4)
    fleet = inprocess.make_fleet("fedcos", {"eta_c": 0.0, "warm_start": True}, MLP, clients=3, seed=4)
    initial = copy.deepcopy(fleet.server.model)
    inprocess.run_round(fleet, 1, data, FULL_BATCH, seed=4, participants=[0, 1])
    assert all(np.array_equal(fleet.server.model[n], initial[n]) for n in initial)
    assert all(np.array_equal(state_to_arrays(fleet.models[0])[n], initial[n]) for n in initial)
    gradients = []
    for index in (0, 1):
        model = build(MLP)
        model.load_state_dict({n: torch.from_numpy(v) for n, v in initial.items()})
        F.cross_entropy(model(data[index][0]), data[index][1]).backward()
        gradients.append({n: p.grad.numpy() for n, p in model.named_parameters()})
    for name, value in fleet.server.initial_c.items():
        assert np.allclose(value, (gradients[0][name] + gradients[1][name]) / 2, atol=1e-6)
    received = []
    inprocess.run_round(fleet, 2, data, SGD, seed=4,
                        inspect=lambda i, payload, model: received.append((i, set(payload.groups))))
    assert received == [(0, {"model", "cv"}), (1, {"model", "cv"}), (2, {"model", "cv"})]
    assert all(torch.allclose(fleet.clients[2].c[n], torch.from_numpy(v)) for n, v in fleet.server.initial_c.items())
    inprocess.run_round(fleet, 3, data, SGD, seed=4,
                        inspect=lambda i, payload, model: received.append((i, set(payload.groups))))
    assert received[3:] == [(0, {"model"}), (1, {"model"}), (2, {"model"})]
    with pytest.raises(ValueError, match="reset_each_round"):
        registry.make_config("fedcos", {"warm_start": True, "reset_each_round": True})


def test_selection_rate_and_boosted_reselection_after_a_missed_deadline() -> None:
    server = make_server(clients=10, sample_rate=0.3, boost=4.0)
    available = list(range(10))
    picked = server.select(1, available, np.random.default_rng(0))
    assert picked is not None and len(picked) == 3 and picked == sorted(set(picked))
    assert server.select(1, available, np.random.default_rng(0)) == picked
    server.missed(1, [7])
    rng = np.random.default_rng(1)
    boosted = np.mean([7 in (server.select(2, available, rng) or []) for _ in range(2000)])
    later = np.mean([7 in (server.select(3, available, rng) or []) for _ in range(2000)])
    assert boosted > 0.45 and abs(later - 0.3) < 0.05
    assert len(server.select(4, [2, 5], rng) or []) == 1
    server.missed(4, [3])
    assert server.boosted == {3: 5}
    arrays, meta = server.state_dict()
    resumed = make_server(clients=10, sample_rate=0.3, boost=4.0)
    resumed.load_state_dict(arrays, json.loads(json.dumps(meta)))
    assert resumed.boosted == {3: 5}
    with pytest.raises(ValueError, match="sample_rate"):
        registry.make_config("fedcos", {"sample_rate": 0.2})


def test_8_bit_uploads_are_dequantised_before_averaging() -> None:
    data = client_data(2, seed=6)
    fleet = inprocess.make_fleet("fedcos", {"eta_c": 0.05, "quantize": True, "sample_rate": 1.0}, MLP, clients=2)
    exact = inprocess.make_fleet("fedcos", {"eta_c": 0.05, "sample_rate": 1.0}, MLP, clients=2)
    sent: list[Payload] = []
    original = fleet.clients[0].make_update
    fleet.clients[0].make_update = lambda r, m, s: sent.append(original(r, m, s)) or sent[-1]
    metrics = inprocess.run_round(fleet, 1, data, SGD)
    inprocess.run_round(exact, 1, data, SGD)
    assert sent[0].groups["delta"].value_dtype == "int8"
    assert abs(sum(metrics["cos_weights"].values()) - 1) < 1e-9
    for name, value in exact.server.model.items():
        spread = np.abs(value - fleet.server.model[name]).max()
        assert spread <= np.abs(sent[0].groups["delta"].dense[name]).max() / 127 + 1e-6
    assert sum(fleet.bytes_up) < 0.5 * sum(exact.bytes_up)


def test_server_state_round_trip_and_full_rounds() -> None:
    data = client_data(4, seed=7)
    fleet = inprocess.make_fleet("fedcos", {"eta_c": 0.05}, MLP, clients=4, seed=7)
    for round_number in range(1, 4):
        chosen = fleet.server.select(round_number, list(range(4)), np.random.default_rng(round_number))
        metrics = inprocess.run_round(fleet, round_number, data, SGD, seed=7, participants=chosen)
        assert len(chosen) == 2 and abs(sum(metrics["cos_weights"].values()) - 1) < 1e-9
    arrays, meta = fleet.server.state_dict()
    resumed = make_server(clients=4)
    resumed.load_state_dict(arrays, json.loads(json.dumps(meta)))
    assert all(np.array_equal(resumed.model[n], v) for n, v in fleet.server.model.items())
    assert inprocess.global_arrays(fleet).keys() == fleet.server.model.keys()
