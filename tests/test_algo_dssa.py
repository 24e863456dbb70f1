"""DSSA over FedAvg, FedProx and SCAFFOLD: the checks of docs/algorithms.md section 4.6 and the section 10 options.

Every round goes through the real codec (encode -> bytes -> decode); payload sizes are counted on decoded packets.
"""

from __future__ import annotations

import shutil
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch

from fedge import codec
from fedge.algorithms import dssa, fedavg, fedprox, scaffold
from fedge.algorithms.base import ClientUpdate, Payload
from fedge.algorithms.loop import TrainSettings
from fedge.algorithms.registry import REGISTRY, AlgorithmSpec
from fedge.algorithms.sparse import FlatLayout
from fedge.codec import TensorGroup
from fedge.simulation.inprocess import Fleet, global_arrays, make_fleet, run_round, through_codec
from tests.algo_helpers import ADAM, SGD, TINY_MLP, client_data, same_arrays

NAMES = {"dssa-fedavg": fedavg, "dssa-fedprox": fedprox, "dssa-scaffold": scaffold}
BASES = [("dssa-fedavg", {}), ("dssa-fedprox", {"mu": 0.1}), ("dssa-scaffold", {})]
ADAMW = TrainSettings(epochs=1, batch_size=16, lr=1e-3, optimizer="adamw", weight_decay=0.1)
DATA = client_data(TINY_MLP, 3, samples=32)


def test_the_dssa_names_are_registered_over_their_bases() -> None:
    for name, base in NAMES.items():
        assert REGISTRY[name] == AlgorithmSpec(dssa, base)


def prunable(fleet: Fleet) -> FlatLayout:
    return fleet.server.layout  # type: ignore[no-any-return]


def floats(group: TensorGroup) -> int:
    dense = sum(a.size for a in group.dense.values() if np.issubdtype(a.dtype, np.floating))
    return int(dense + (group.sparse.values.size if group.sparse is not None else 0))


def recorded_updates(fleet: Fleet) -> list[list[ClientUpdate]]:
    """Each round's folded updates, in client order, as the server half's fold saw them."""
    seen: list[list[ClientUpdate]] = []
    rounds: list[int] = []
    fold = fleet.server.fold

    def recording(round_number: int, update: ClientUpdate) -> None:
        if not rounds or rounds[-1] != round_number:
            rounds.append(round_number)
            seen.append([])
        seen[-1].append(update)
        seen[-1].sort(key=lambda u: u.index)
        fold(round_number, update)

    fleet.server.fold = recording
    return seen


class Received:
    """The decoded downlink, the mask and the model each client held right after on_receive."""

    def __init__(self) -> None:
        self.payloads: dict[int, Payload] = {}
        self.models: dict[int, np.ndarray] = {}

    def __call__(self, index: int, payload: Payload, model: torch.nn.Module) -> None:
        self.payloads[index] = payload
        self.models[index] = np.concatenate([p.detach().numpy().ravel().copy() for n, p in model.named_parameters()
                                             if n.endswith("weight")])

    def mask(self) -> np.ndarray:
        section = next(iter(self.payloads.values())).groups["model"].sparse
        assert section is not None and section.kind == "mask"
        return np.asarray(section.mask)


def weights_of(model: torch.nn.Module) -> np.ndarray:
    return np.concatenate([p.detach().numpy().ravel() for n, p in model.named_parameters() if n.endswith("weight")])


@pytest.mark.parametrize("settings", [ADAM, ADAMW, SGD], ids=["adam", "adamw-decay", "sgd"])
@pytest.mark.parametrize(("name", "options"), BASES)
def test_retained_weights_are_frozen_and_complement_starts_at_zero(name: str, options: dict[str, Any],
                                                                   settings: TrainSettings) -> None:
    fleet = make_fleet(name, {**options, "warmup_rounds": 1}, TINY_MLP, clients=3, seed=1)
    run_round(fleet, 1, DATA, settings, seed=1)
    for round_number in (2, 3):
        seen = Received()
        run_round(fleet, round_number, DATA, settings, seed=1, inspect=seen)
        mask = seen.mask()
        for index, before in seen.models.items():
            assert not before[~mask].any()  # complement weights are exactly 0 before the first step
            after = weights_of(fleet.models[index])
            assert np.array_equal(after[mask], before[mask])  # retained: bit-identical after training
            assert after[~mask].any()
        server = prunable(fleet).flat(global_arrays(fleet))
        assert np.array_equal(server[mask], seen.models[0][mask])


def test_mask_keeps_exactly_k_and_the_count_is_exact_decimal() -> None:
    layout = FlatLayout(("a", "b"), ((5,), (5,)))
    arrays = {"a": np.arange(1, 6, dtype=np.float32), "b": -np.arange(6, 11, dtype=np.float32)}
    for p in (0.2, 0.5, 0.8, 0.7):
        k = 10 - int(Fraction(str(p)) * 10)
        mask = dssa.retained_mask(arrays, layout, p)
        assert int(mask.sum()) == k and mask[10 - k:].all()
    assert int(dssa.retained_mask(arrays, layout, 0.8).sum()) == 2  # 1 - 0.8 != 0.2 in binary floating point


def test_mask_is_global_and_ties_go_to_the_first_flat_indices() -> None:
    fleet = make_fleet("dssa-fedavg", {"warmup_rounds": 0}, TINY_MLP, clients=1, seed=0)
    model = fleet.server.base.model
    rng = np.random.default_rng(0)
    model["fc1.weight"] = (10 + rng.random(model["fc1.weight"].shape)).astype(np.float32)
    for name in ("fc2.weight", "fc3.weight"):
        model[name] = (0.01 * rng.standard_normal(model[name].shape)).astype(np.float32)
    down, _ = through_codec(fleet.server.downlink(1, 0), "task", 1)
    section = down.groups["model"].sparse
    sizes = dict(zip(section.names, FlatLayout(section.names, section.shapes).sizes, strict=True))
    assert section.names == ("fc1.weight", "fc2.weight", "fc3.weight")  # only weights: biases are never masked
    assert set(down.groups["model"].dense) == {"fc1.bias", "fc2.bias", "fc3.bias"}
    assert section.mask[:sizes["fc1.weight"]].all()  # layer A survives whole: the mask is not per layer
    assert int(section.mask.sum()) == codec.retained_count(section.size, sparsity=0.5)

    for name in section.names:
        model[name] = np.where(rng.random(model[name].shape) < 0.5, -0.25, 0.25).astype(np.float32)
    fleet.server.cached = None
    mask = fleet.server.downlink(2, 0).groups["model"].sparse.mask
    k = codec.retained_count(section.size, sparsity=0.5)
    assert mask[:k].all() and not mask[k:].any()


def test_mask_is_recomputed_every_round_so_it_rotates() -> None:
    fleet = make_fleet("dssa-fedavg", {"warmup_rounds": 0}, TINY_MLP, clients=2, seed=3)
    seen = Received()
    run_round(fleet, 1, DATA, ADAM, seed=3, inspect=seen)
    first = seen.mask()
    layout = prunable(fleet)
    flat = layout.flat(fleet.server.base.model)
    retained, trainable = int(np.flatnonzero(first)[0]), int(np.flatnonzero(~first)[0])
    flat[retained], flat[trainable] = 0.0, 1e3  # the retained weight becomes the smallest, and the reverse
    fleet.server.base.model.update(layout.split(flat))
    seen = Received()
    run_round(fleet, 2, DATA, ADAM, seed=3, inspect=seen)
    second = seen.mask()
    assert not second[retained] and second[trainable]


def test_lambda_scales_the_complement_only() -> None:
    results = {}
    for scale in (1.0, 2.0):
        fleet = make_fleet("dssa-fedavg", {"warmup_rounds": 0, "scale": scale}, TINY_MLP, clients=1, seed=2)
        seen = Received()
        run_round(fleet, 1, DATA[:1], ADAM, seed=2, inspect=seen)
        results[scale] = (global_arrays(fleet), weights_of(fleet.models[0]), seen.mask())
    (one, trained, mask), (two, _, _) = results[1.0], results[2.0]
    layout = FlatLayout.of(one, ("fc1.weight", "fc2.weight", "fc3.weight"))
    assert np.array_equal(layout.flat(one)[~mask], trained[~mask])  # lambda = 1: the client's trained values
    assert np.array_equal(layout.flat(two)[~mask], 2 * trained[~mask])  # lambda = 2 doubles them exactly
    assert np.array_equal(layout.flat(two)[mask], layout.flat(one)[mask])
    for bias in ("fc1.bias", "fc2.bias", "fc3.bias"):
        assert np.array_equal(one[bias], two[bias])  # biases: no lambda


@pytest.mark.parametrize(("name", "options"), BASES)
def test_warmup_covering_the_run_is_the_base_algorithm_bit_for_bit(name: str, options: dict[str, Any]) -> None:
    runs = []
    for algorithm, extra in ((name, {"warmup_rounds": 3}), (name.removeprefix("dssa-"), {})):
        fleet = make_fleet(algorithm, {**options, **extra}, TINY_MLP, clients=3, seed=4)
        for round_number in (1, 2, 3):
            run_round(fleet, round_number, DATA, ADAM, seed=4, participants=[0, 2] if round_number == 2 else None)
        runs.append(global_arrays(fleet))
    assert same_arrays(*runs)


@pytest.mark.parametrize(("name", "options"), BASES)
def test_payload_sizes_counted_on_decoded_packets(name: str, options: dict[str, Any]) -> None:
    fleet = make_fleet(name, {**options, "warmup_rounds": 0}, TINY_MLP, clients=2, seed=0)
    uploads = recorded_updates(fleet)
    seen = Received()
    run_round(fleet, 1, DATA, ADAM, seed=0, inspect=seen)
    arrays = global_arrays(fleet)
    n_w = prunable(fleet).size
    k = codec.retained_count(n_w, sparsity=0.5)
    rest = sum(a.size for n, a in arrays.items() if n not in prunable(fleet).names)
    down, up = seen.payloads[0], uploads[0][0].payload
    assert down.groups["model"].sparse.mask.size == n_w  # the mask: N_w bits
    assert up.groups[next(iter(up.groups))].sparse.indices is None  # no indices travel up
    down_floats = sum(floats(g) for g in down.groups.values())
    up_floats = sum(floats(g) for g in up.groups.values())
    if name == "dssa-scaffold":
        assert down_floats == (k + rest) + ((n_w - k) + rest) == 2 * (k + rest)  # c[T] down; k = N_w / 2
        assert up_floats == 2 * ((n_w - k) + rest)
    else:
        assert (down_floats, up_floats) == (k + rest, (n_w - k) + rest)


def test_fedprox_shrinks_the_complement_toward_zero() -> None:
    eta, mu = 0.1, 0.5
    fleet = make_fleet("dssa-fedprox", {"warmup_rounds": 0, "mu": mu}, TINY_MLP, clients=1, seed=0)
    client, model = fleet.clients[0], fleet.models[0]
    down, _ = through_codec(fleet.server.downlink(1, 0), "task", 1)
    client.on_receive(1, down, model)
    mask = np.asarray(down.groups["model"].sparse.mask)
    layout = prunable(fleet)
    params = dict(model.named_parameters())
    masks = layout.parts(mask)
    with torch.no_grad():
        for name in layout.names:
            params[name].copy_(torch.where(torch.from_numpy(masks[name]), params[name],
                                           torch.randn_like(params[name])))
    start = {n: p.detach().clone() for n, p in params.items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=eta)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # zero data gradient
    client.after_backward(model)
    optimizer.step()
    client.after_step(model)
    for name in layout.names:
        retained = torch.from_numpy(masks[name])
        assert torch.equal(params[name][retained], start[name][retained])
        assert torch.allclose(params[name][~retained], (1 - eta * mu) * start[name][~retained], rtol=1e-6, atol=0)
    assert torch.equal(params["fc1.bias"], start["fc1.bias"])


def test_scaffold_control_variates_move_only_on_the_trainable_set() -> None:
    fleet = make_fleet("dssa-scaffold", {"warmup_rounds": 1}, TINY_MLP, clients=3, seed=5)
    layout = prunable(fleet)
    run_round(fleet, 1, DATA, ADAM, seed=5)
    for round_number, chosen in ((2, [0, 1, 2]), (3, [1, 2])):
        before_c = layout.flat(fleet.server.base.control)
        before_own = [layout.flat(c.base.own) for c in fleet.clients]
        seen = Received()
        run_round(fleet, round_number, DATA, ADAM, seed=5, participants=chosen, inspect=seen)
        mask = seen.mask()
        control = seen.payloads[chosen[0]].groups["control"].sparse
        assert control.kind == "masked-values" and control.values.size == int((~mask).sum())
        assert np.array_equal(layout.flat(fleet.server.base.control)[mask], before_c[mask])
        assert not np.array_equal(layout.flat(fleet.server.base.control)[~mask], before_c[~mask])
        for index in chosen:
            assert np.array_equal(layout.flat(fleet.clients[index].base.own)[mask], before_own[index][mask])
        mean = {n: np.mean([c.base.own[n] for c in fleet.clients], axis=0) for n in fleet.server.base.control}
        assert max(float(np.abs(mean[n] - c).max()) for n, c in fleet.server.base.control.items()) < 1e-6


def test_lossy_values_keep_both_sides_on_the_same_retained_weights() -> None:
    sizes = {}
    for dtype in ("f32", "f16", "int8"):
        fleet = make_fleet("dssa-fedavg", {"warmup_rounds": 0, "value_dtype": dtype}, TINY_MLP, clients=2, seed=7)
        seen = Received()
        run_round(fleet, 1, DATA, ADAM, seed=7, inspect=seen)
        mask = seen.mask()
        server = prunable(fleet).flat(global_arrays(fleet))
        assert np.array_equal(server[mask], seen.models[0][mask])
        assert np.array_equal(weights_of(fleet.models[1])[mask], seen.models[1][mask])
        sizes[dtype] = (fleet.bytes_down[0], fleet.bytes_up[0])
        if dtype == "f16":
            values = seen.payloads[0].groups["model"].sparse.values
            assert np.array_equal(values, values.astype(np.float16).astype(np.float32))
    assert sizes["f16"][0] < 0.6 * sizes["f32"][0] and sizes["f16"][1] < 0.6 * sizes["f32"][1]
    assert sizes["int8"][0] < sizes["f16"][0]


def test_uplink_keep_sends_top_fraction_with_indices_and_keeps_the_residual() -> None:
    sigma = 0.25
    fleet = make_fleet("dssa-fedprox", {"warmup_rounds": 0, "uplink_keep": sigma}, TINY_MLP, clients=2, seed=8)
    uploads = recorded_updates(fleet)
    layout = prunable(fleet)
    residual = np.zeros(layout.size, dtype=np.float32)
    for round_number in (1, 2):
        seen = Received()
        run_round(fleet, round_number, DATA, ADAM, seed=8, inspect=seen)
        mask = seen.mask()
        section = uploads[-1][0].payload.groups["model"].sparse
        complement = np.flatnonzero(~mask)
        assert section.kind == "indices"
        assert section.indices.size == codec.retained_count(complement.size, keep=sigma)
        assert not mask[section.indices].any()
        update = np.where(mask, 0, weights_of(fleet.models[0])) + residual
        assert np.array_equal(section.values, update[section.indices])  # top |u| of the complement
        assert np.abs(update[section.indices]).min() >= np.abs(np.delete(update, section.indices)[
            ~np.delete(mask, section.indices)]).max()
        residual = fleet.clients[0].state_dict()["dssa/residual"]
        expected = update.copy()
        expected[section.indices] = 0
        assert np.array_equal(residual, expected)
    restored = dssa.Client(fleet.clients[0].config, 0, fedprox)
    restored.load_state_dict(fleet.clients[0].state_dict())
    assert np.array_equal(restored.residual, residual)


def test_pruned_evaluation_and_checkpoint_round_trip() -> None:
    fleet = make_fleet("dssa-scaffold", {"warmup_rounds": 1}, TINY_MLP, clients=2, seed=9)
    assert fleet.server.pruned_evaluation_arrays() is None
    run_round(fleet, 1, DATA, ADAM, seed=9)
    pruned = fleet.server.pruned_evaluation_arrays()
    layout = prunable(fleet)
    mask = dssa.retained_mask(global_arrays(fleet), layout, 0.5)
    assert np.array_equal(layout.flat(pruned), np.where(mask, layout.flat(global_arrays(fleet)), 0))
    arrays, meta = fleet.server.state_dict()
    twin = make_fleet("dssa-scaffold", {"warmup_rounds": 1}, TINY_MLP, clients=2, seed=9)
    twin.server.load_state_dict(arrays, meta)
    for a, b in zip(fleet.states, twin.states, strict=True):  # the devices' committed state, as a restart finds it
        shutil.copyfile(a.committed_path, b.committed_path)
    for f in (fleet, twin):
        run_round(f, 2, DATA, ADAM, seed=9)
    assert same_arrays(global_arrays(fleet), global_arrays(twin))


def test_options_are_validated_and_split_between_dssa_and_the_base() -> None:
    config = dssa.make_config(fedprox, {"mu": 0.3, "sparsity": 0.2, "scale": 2.0})
    assert config.base == fedprox.Config(mu=0.3) and config.sparsity == 0.2
    with pytest.raises(ValueError, match="mu"):
        dssa.make_config(fedavg, {"mu": 0.1})
    with pytest.raises(ValueError):
        dssa.make_config(fedavg, {"uplink_keep": 0.0})
