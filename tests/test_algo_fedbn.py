"""FedBN keeps every BatchNorm tensor on its device (docs/algorithms.md section 7, checks 1-5), in-process on a CPU."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from fedge.algorithms import fedavg, fedbn, registry
from fedge.algorithms.base import Payload
from fedge.algorithms.loop import TrainSettings, evaluate
from fedge.models import ModelSpec, arrays_to_state, batch_norm_names, build, state_to_arrays
from fedge.simulation import inprocess

BN_SPEC = ModelSpec(name="cnn-bn", input_shape=(1, 8, 8), num_classes=4)
PLAIN_SPEC = ModelSpec(name="cnn", input_shape=(1, 8, 8), num_classes=4)
SETTINGS = TrainSettings(epochs=1, batch_size=16, lr=0.05, optimizer="sgd")


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Register the module under test (training runs on one thread: conftest's ``one_thread``)."""
    monkeypatch.setitem(registry.REGISTRY, "fedbn", registry.AlgorithmSpec(fedbn))
    yield


def domains(sizes: list[int], seed: int = 0, scale: tuple[float, ...] = (), noise: float = 1.0
            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four classes, one random 8x8 prototype each, plus noise; client i's inputs scaled and shifted by scale[i]."""
    generator = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(4, 1, 8, 8, generator=generator)
    result = []
    for index, size in enumerate(sizes):
        labels = torch.randint(0, 4, (size,), generator=generator)
        inputs = prototypes[labels] + noise * torch.randn(size, 1, 8, 8, generator=generator)
        factor = scale[index] if index < len(scale) else 1.0
        result.append((inputs * factor + (factor - 1.0) * 0.4, labels))
    return result


def record_uploads(fleet: inprocess.Fleet) -> list[list[Payload]]:
    """Wrap every client's make_update so the test sees each upload payload (before the codec)."""
    seen: list[list[Payload]] = [[] for _ in fleet.clients]
    for index, client in enumerate(fleet.clients):
        original = client.make_update

        def wrapped(round_number, model, stats, _original=original, _index=index):  # type: ignore[no-untyped-def]
            payload = _original(round_number, model, stats)
            seen[_index].append(payload)
            return payload

        client.make_update = wrapped
    return seen


def bn_of(model: torch.nn.Module) -> dict[str, np.ndarray]:
    names = set(batch_norm_names(model))
    return {n: a for n, a in state_to_arrays(model).items() if n in names}


def test_bn_tensors_are_what_local_training_produced_and_survive_a_restart() -> None:
    data = domains([48, 64, 80])
    fleet = inprocess.make_fleet("fedbn", {}, BN_SPEC, clients=3, seed=1)
    after_training: dict[int, dict[str, np.ndarray]] = {}
    checked = []

    def inspect(index: int, payload: Payload, model: torch.nn.Module) -> None:
        if index in after_training:
            for name, value in bn_of(model).items():
                assert np.array_equal(value, after_training[index][name]), name
            checked.append(index)

    for round_number in range(1, 4):
        inprocess.run_round(fleet, round_number, data, SETTINGS, seed=1, inspect=inspect)
        for index, model in enumerate(fleet.models):
            after_training[index] = bn_of(model)
            state = fleet.clients[index].state_dict()
            assert set(state) == set(after_training[index])
            assert all(np.array_equal(state[n], after_training[index][n]) for n in state)
    assert sorted(checked) == [0, 0, 1, 1, 2, 2]
    assert any(not np.array_equal(after_training[0][n], after_training[1][n]) for n in after_training[0])

    wiped = copy.deepcopy(fleet.models[0])
    fleet.clients[0].load_state_dict({})
    fleet.clients[0].on_receive(4, fleet.server.downlink(4, 0), wiped)
    for name, value in bn_of(wiped).items():
        assert np.array_equal(value, bn_of(build(BN_SPEC))[name]), name

    restarted = registry.make_client("fedbn", {}, 2)
    restarted.load_state_dict(fleet.clients[2].state_dict())
    fresh = build(BN_SPEC)
    restarted.on_receive(4, fleet.server.downlink(4, 2), fresh)
    for name, value in bn_of(fresh).items():
        assert np.array_equal(value, after_training[2][name])


@pytest.mark.parametrize("upload", ["model", "delta"])
def test_bn_tensors_never_travel(upload: str) -> None:
    data = domains([32, 32])
    fleet = inprocess.make_fleet("fedbn", {"upload": upload}, BN_SPEC, clients=2, seed=2)
    bn_names = set(batch_norm_names(fleet.models[0]))
    shared_names = set(state_to_arrays(fleet.models[0])) - bn_names
    assert bn_names and set(fleet.server.state_dict()[0]) == {f"model/{n}" for n in shared_names}
    downlinks: list[Payload] = []
    uploads = record_uploads(fleet)
    for round_number in range(1, 3):
        inprocess.run_round(fleet, round_number, data, SETTINGS, seed=2,
                            inspect=lambda i, payload, m: downlinks.append(payload))
    payloads = downlinks + [p for per_client in uploads for p in per_client]
    assert len(payloads) == 8
    for payload in payloads:
        names = {n for group in payload.groups.values() for n in group.dense}
        assert names == shared_names


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_shared_tensors_are_the_weighted_mean_and_identical_everywhere(weighting: str) -> None:
    sizes = [24, 40, 72]
    data = domains(sizes, seed=3)
    fleet = inprocess.make_fleet("fedbn", {"weighting": weighting}, BN_SPEC, clients=3, seed=3)
    uploads = record_uploads(fleet)
    inprocess.run_round(fleet, 1, data, SETTINGS, seed=3)
    weights = np.array(sizes) / sum(sizes) if weighting == "samples" else np.full(3, 1 / 3)
    received = []
    for index in range(3):
        model = copy.deepcopy(fleet.models[index])
        fleet.clients[index].on_receive(2, fleet.server.downlink(2, index), model)
        received.append(state_to_arrays(model))
    bn_names = set(batch_norm_names(fleet.models[0]))
    for name, value in fleet.server.model.items():
        assert name not in bn_names
        stack = np.stack([np.asarray(up[0].groups["model"].dense[name], np.float64) for up in uploads])
        if np.issubdtype(value.dtype, np.floating):
            assert np.allclose(value, np.tensordot(weights, stack, axes=1), atol=1e-6)
        for arrays in received:
            assert np.array_equal(arrays[name], value)
    assert any(not np.array_equal(received[0][n], received[1][n]) for n in bn_names)


def test_a_model_without_batch_norm_runs_exactly_as_fedavg() -> None:
    data = domains([40, 56], seed=4)
    runs = {}
    for name in ("fedavg", "fedbn"):
        fleet = inprocess.make_fleet(name, {}, PLAIN_SPEC, clients=2, seed=4)
        for round_number in range(1, 4):
            inprocess.run_round(fleet, round_number, data, SETTINGS, seed=4)
        runs[name] = (inprocess.global_arrays(fleet), [state_to_arrays(m) for m in fleet.models])
    (avg_global, avg_models), (bn_global, bn_models) = runs["fedavg"], runs["fedbn"]
    assert set(avg_global) == set(bn_global)
    assert all(np.array_equal(avg_global[n], bn_global[n]) for n in avg_global)
    for a, b in zip(avg_models, bn_models, strict=True):
        assert all(np.array_equal(a[n], b[n]) for n in a)


def test_feature_shift_fedbn_is_at_least_as_accurate_as_fedavg() -> None:
    train = domains([160, 160], seed=5, scale=(1.0, 5.0), noise=1.5)
    test = domains([400, 400], seed=5, scale=(1.0, 5.0), noise=1.5)
    accuracy = {}
    for name in ("fedavg", "fedbn"):
        fleet = inprocess.make_fleet(name, {"weighting": "uniform"}, BN_SPEC, clients=2, seed=5)
        for round_number in range(1, 21):
            inprocess.run_round(fleet, round_number, train, SETTINGS, seed=5)
        scores = []
        for index, (inputs, labels) in enumerate(test):
            model = copy.deepcopy(fleet.models[index])
            if name == "fedbn":
                fleet.clients[index].on_receive(21, fleet.server.downlink(21, index), model)
            else:
                arrays_to_state(model, inprocess.global_arrays(fleet))
            scores.append(evaluate(model, inputs, labels)[0])
        accuracy[name] = float(np.mean(scores))
    assert fleet.server.evaluation_arrays() is None
    assert accuracy["fedbn"] >= accuracy["fedavg"], accuracy


def test_fedbn_options_are_fedavgs() -> None:
    assert fedbn.Config is fedavg.Config
    with pytest.raises(ValueError, match="weighting"):
        registry.make_config("fedbn", {"weighting": "median"})
