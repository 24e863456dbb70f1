"""ef-fedavg / ef-fedprox (docs/ef.md): the replica never drifts, resyncs are counted, keep is respected."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fedge import codec
from fedge.algorithms import ef, fedavg, fedprox
from fedge.algorithms.base import ClientUpdate, Payload
from fedge.algorithms.registry import REGISTRY, AlgorithmSpec
from fedge.models import state_to_arrays
from fedge.simulation.inprocess import RUN_ID, Fleet, global_arrays, make_fleet, run_round
from tests.algo_helpers import ADAM, TINY_CNN_BN, TINY_MLP, client_data, same_arrays

DATA = client_data(TINY_MLP, 4, samples=32)
PATTERN = [[0, 1, 2, 3], [0, 1], [0, 1, 2], [1], [0, 1], [3, 0], [2], [0, 1, 2, 3]]


def test_the_ef_names_are_registered_over_their_bases() -> None:
    for name, base in (("ef-fedavg", fedavg), ("ef-fedprox", fedprox)):
        assert REGISTRY[name] == AlgorithmSpec(ef, base)


class ReplicaCheck:
    """After each on_receive: the client's replica, and the model it trains from, equal the public model."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.kinds: dict[int, list[str]] = {}

    def __call__(self, index: int, payload: Payload, model: torch.nn.Module) -> None:
        public = self.fleet.server.public
        assert same_arrays(self.fleet.clients[index].start, public)
        assert same_arrays(self.fleet.clients[index].replica.key, self.fleet.server.model.key)
        assert same_arrays(state_to_arrays(model), public)
        self.kinds[index] = sorted(payload.groups)


def restart(fleet: Fleet, name: str, options: dict[str, Any]) -> None:
    """Devices and coordinator restart from their saved state."""
    base = fedprox if name == "ef-fedprox" else fedavg
    config = ef.make_config(base, options)
    states = [client.state_dict() for client in fleet.clients]
    fleet.clients = [ef.Client(config, index, base) for index in range(len(states))]
    for client, state in zip(fleet.clients, states, strict=True):
        client.initial_model(fleet.initial)
        client.load_state_dict({k: np.array(v, copy=True) for k, v in state.items()})
    arrays, meta = fleet.server.state_dict()
    fleet.server = ef.Server(config, global_arrays(fleet), fleet.server.context, base)
    fleet.server.load_state_dict({k: np.array(v, copy=True) for k, v in arrays.items()}, meta)


@pytest.mark.parametrize(("name", "options"), [("ef-fedavg", {}), ("ef-fedprox", {"mu": 0.1, "value_dtype": "bf16"}),
                                               ("ef-fedavg", {"value_dtype": "f16", "history": 2}),
                                               ("ef-fedprox", {"keep": 0.3, "value_dtype": "ternary"})])
def test_replica_is_the_public_model_bit_for_bit_through_misses_and_restarts(name: str,
                                                                          options: dict[str, Any]) -> None:
    fleet = make_fleet(name, options, TINY_MLP, clients=4, seed=1)
    for round_number, chosen in enumerate(PATTERN, start=1):
        if round_number == 5:
            restart(fleet, name, options)
        check = ReplicaCheck(fleet)
        run_round(fleet, round_number, DATA, ADAM, seed=1, participants=chosen, inspect=check)
        assert len(check.kinds) == len(chosen)
    assert fleet.clients[0].start_version == len(PATTERN) - 1 and np.abs(fleet.clients[0].residual).max() > 0


def test_with_a_keyframe_every_round_missed_rounds_get_the_delta_chain_or_a_dense_copy_and_both_are_counted() -> None:
    fleet = make_fleet("ef-fedavg", {"history": 3, "keyframe_ratio": 0.0}, TINY_MLP, clients=3, seed=2)
    seen: dict[int, list[str]] = {}
    sizes = []
    for round_number, chosen in enumerate([[0, 1, 2], [0], [0], [0, 1], [0], [0], [0], [0, 2]], start=1):
        check = ReplicaCheck(fleet)
        before = len(fleet.bytes_down)
        metrics = run_round(fleet, round_number, DATA, ADAM, seed=2, participants=chosen, inspect=check)
        sizes.append(dict(zip(chosen, fleet.bytes_down[before:], strict=True)))
        seen.update({(round_number, i): k for i, k in check.kinds.items()})  # type: ignore[misc]
        assert metrics["ef_keyframe"] == 1
        if round_number == 8:
            assert metrics["ef_dense_resyncs"] == 1
    assert seen[(1, 0)] == []  # never synced: it rebuilds the initial model, no tensor travels
    assert seen[(2, 0)] == ["delta-1"]
    assert seen[(4, 1)] == ["delta-1", "delta-2", "delta-3"]  # missed two rounds: the chain, smaller than dense
    assert seen[(8, 2)] == ["public"]  # missed more rounds than the history holds: dense f32
    floats = sum(a.size for a in global_arrays(fleet).values())
    assert sizes[7][2] > 2 * floats > 4 * sizes[7][0]  # the resync travels in (and is counted by) the packet
    assert sizes[3][1] < sizes[7][2] / 3
    assert sizes[0][0] < 1000 < floats  # the first task: headers and meta only


def test_keep_fraction_is_respected_both_ways() -> None:
    fleet = make_fleet("ef-fedavg", {"keep": 0.05}, TINY_MLP, clients=2, seed=3)
    uploads: list[ClientUpdate] = []
    fold = fleet.server.fold
    fleet.server.fold = lambda r, update: (uploads.append(update), fold(r, update))[1]
    run_round(fleet, 1, DATA, ADAM, seed=3)
    seen: list[Payload] = []
    run_round(fleet, 2, DATA, ADAM, seed=3, inspect=lambda i, p, m: seen.append(p))
    n = fleet.server.layout.size
    k = codec.retained_count(n, keep=0.05)
    for update in uploads:
        section = update.payload.groups["update"].sparse
        assert section.kind == "indices" and section.indices.size == k
    assert seen[0].groups["delta-1"].sparse.indices.size == k
    assert seen[0].groups["delta-1"].value_dtype == "f16"


def test_keep_one_in_f32_is_fedavg_with_deltas_bit_for_bit() -> None:
    runs = []
    for name, options in (("ef-fedavg", {"keep": 1.0, "value_dtype": "f32"}), ("fedavg", {"upload": "delta"})):
        fleet = make_fleet(name, options, TINY_MLP, clients=3, seed=4)
        for round_number in (1, 2, 3):
            run_round(fleet, round_number, DATA, ADAM, seed=4)
        runs.append(global_arrays(fleet))
    assert same_arrays(*runs)


def test_error_feedback_keeps_what_was_not_sent_on_both_sides() -> None:
    fleet = make_fleet("ef-fedavg", {"keep": 0.1, "value_dtype": "f32"}, TINY_MLP, clients=1, seed=5)
    run_round(fleet, 1, DATA, ADAM, seed=5)
    client, server = fleet.clients[0], fleet.server
    start = server.layout.flat(client.start)
    trained = server.layout.flat(state_to_arrays(fleet.models[0]))
    delta = trained - start
    assert np.array_equal(client.residual[client.residual != 0], delta[client.residual != 0])
    assert int((client.residual == 0).sum()) >= codec.retained_count(delta.size, keep=0.1)
    moved = server.layout.flat(server.public) - start
    np.testing.assert_allclose(moved + server.residual, delta - client.residual, atol=1e-6)


def test_fedprox_anchor_is_the_public_model() -> None:
    fleet = make_fleet("ef-fedprox", {"mu": 0.5}, TINY_MLP, clients=2, seed=6)
    run_round(fleet, 1, DATA, ADAM, seed=6)
    check: list[bool] = []

    def anchored(index: int, payload: Payload, model: torch.nn.Module) -> None:
        anchor = fleet.clients[index].base.anchor
        check.append(all(np.array_equal(anchor[n].numpy(), fleet.server.public[n]) for n in anchor))

    run_round(fleet, 2, DATA, ADAM, seed=6, inspect=anchored)
    assert check == [True, True]


def test_batch_norm_buffers_follow_the_public_model() -> None:
    data = client_data(TINY_CNN_BN, 2, samples=16)
    fleet = make_fleet("ef-fedavg", {}, TINY_CNN_BN, clients=2, seed=7)
    for round_number, chosen in ((1, [0, 1]), (2, [0]), (3, [0, 1])):
        run_round(fleet, round_number, data, ADAM, seed=7, participants=chosen, inspect=ReplicaCheck(fleet))
    public = fleet.server.public
    assert int(public["bn1.num_batches_tracked"]) == 3  # integer buffers: the clients' maximum, sent dense
    assert not np.array_equal(public["bn1.running_mean"], np.zeros_like(public["bn1.running_mean"]))


def test_options_are_validated() -> None:
    assert ef.make_config(fedprox, {"mu": 0.2, "keep": 0.2}).base == fedprox.Config(mu=0.2)
    with pytest.raises(ValueError, match="mu"):
        ef.make_config(fedavg, {"mu": 0.2})
    for bad in ({"keep": 0.0}, {"value_dtype": "f64"}, {"history": 0}, {"keyframe_ratio": -1.0},
                {"keyframe_rounds": -1}, {"keyframe_rounds": 2.5}, {"residual_decay": 1.5},
                {"residual_decay": -0.1}, {"down_value_dtype": "f64"}):
        with pytest.raises(ValueError):
            ef.make_config(fedavg, bad)


def test_ternary_sends_one_magnitude_per_tensor_and_feeds_back_the_rest() -> None:
    fleet = make_fleet("ef-fedavg", {"keep": 0.3, "value_dtype": "ternary"}, TINY_MLP, clients=2, seed=8)
    uploads: list[ClientUpdate] = []
    fold = fleet.server.fold
    fleet.server.fold = lambda r, update: (uploads.append(update), fold(r, update))[1]
    run_round(fleet, 1, DATA, ADAM, seed=8)
    client, layout = fleet.clients[0], fleet.server.layout
    group = uploads[0].payload.groups["update"]
    section = group.sparse
    assert group.value_dtype == "int8" and section.kind == "indices"
    start = layout.flat(client.start)
    sent = (layout.flat(state_to_arrays(fleet.models[0])) - start)[section.indices]  # residual was zero
    bounds = np.searchsorted(section.indices, np.cumsum([0, *layout.sizes]))
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        if hi > lo:
            magnitudes = np.abs(section.values[lo:hi])
            np.testing.assert_allclose(magnitudes, np.abs(sent[lo:hi]).mean(), rtol=1e-6)
            assert np.array_equal(np.sign(section.values[lo:hi]), np.sign(sent[lo:hi]))
    np.testing.assert_array_equal(client.residual[section.indices], sent - section.values)
    broadcast = fleet.server.model.history[1].values  # the coordinator's delta is ternary too
    assert 1 <= len(np.unique(np.abs(broadcast))) <= len(layout.sizes)


def test_a_quinary_downlink_sends_two_magnitudes_per_tensor_while_the_devices_stay_ternary(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = make_fleet("ef-fedavg", {"keep": 0.3, "value_dtype": "ternary", "down_value_dtype": "quinary"},
                       TINY_MLP, clients=2, seed=9)
    compressed: list[np.ndarray] = []  # what the coordinator compressed (S - K)
    real = ef.compress
    monkeypatch.setattr(ef, "compress", lambda layout, u, keep, dtype, **kw: (compressed.append(u.copy()),
                                                                            real(layout, u, keep, dtype, **kw))[1])
    uploads: list[ClientUpdate] = []
    fold = fleet.server.fold
    fleet.server.fold = lambda r, update: (uploads.append(update), fold(r, update))[1]
    run_round(fleet, 1, DATA, ADAM, seed=9)
    layout, delta = fleet.server.layout, fleet.server.model.history[1]
    for upload in uploads:  # the devices' values: one magnitude a tensor
        section = upload.payload.groups["update"].sparse
        bounds = np.searchsorted(section.indices, np.cumsum([0, *layout.sizes]))
        assert all(len(np.unique(np.abs(section.values[lo:hi]))) <= 1 for lo, hi in
                   zip(bounds[:-1], bounds[1:], strict=True))
    bounds = np.searchsorted(delta.indices, np.cumsum([0, *layout.sizes]))
    two = 0
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        sent, size = delta.values[lo:hi], np.abs(compressed[-1][delta.indices[lo:hi]])
        high = size >= np.median(size)
        np.testing.assert_allclose(np.abs(sent[high]), size[high].mean(), rtol=1e-6)
        if (~high).any():
            np.testing.assert_allclose(np.abs(sent[~high]), size[~high].mean(), rtol=1e-6)
        assert np.array_equal(np.sign(sent), np.sign(compressed[-1][delta.indices[lo:hi]]))
        two += len(np.unique(np.abs(sent))) == 2
    assert two >= 2  # each tensor's magnitudes: the mean of its larger half and of its smaller half
    assert fleet.server.model.group(delta).value_dtype == "int8"


def test_ternary_values_cost_about_one_bit_on_the_wire() -> None:
    rng = np.random.default_rng(0)
    names, shapes = ("w",), ((200_000,),)
    indices = np.sort(rng.choice(200_000, 60_000, replace=False))
    values = rng.normal(size=60_000).astype(np.float32)
    ternary = np.sign(values) * np.abs(values).mean()
    sizes = {}
    for label, vals in (("int8", values), ("ternary", ternary)):
        section = codec.SparseSection.with_indices(names, shapes, indices, vals)
        group = codec.TensorGroup(dense={}, sparse=section, value_dtype="int8")
        sizes[label] = len(codec.encode(codec.Update(run_id="t", round=1, sender="a", groups={"u": group})))
    index_only = codec.SparseSection.with_indices(names, shapes, indices, np.zeros(60_000, np.float32))
    base = len(codec.encode(codec.Update(run_id="t", round=1, sender="a", groups={
        "u": codec.TensorGroup(dense={}, sparse=index_only, value_dtype="int8")})))
    ternary_bits, int8_bits = ((sizes[k] - base) * 8 / 60_000 for k in ("ternary", "int8"))
    assert ternary_bits < 2.0 and 3 * ternary_bits < int8_bits, (ternary_bits, int8_bits)


def test_ef_refuses_a_base_whose_server_half_it_would_silently_replace() -> None:
    from fedge.algorithms import scaffold
    from fedge.algorithms.base import ModelLayout, ServerContext
    from fedge.models import build

    model = build(TINY_MLP)
    context = ServerContext(num_clients=2, layout=ModelLayout.of(model))
    config = ef.make_config(scaffold, {})
    with pytest.raises(ValueError, match="ef aggregates as FedAvg does.*not fedge.algorithms.scaffold's"):
        ef.Server(config, state_to_arrays(model), context, scaffold)


@pytest.mark.parametrize("decay", [0.0, 0.5, 1.0])
def test_a_residual_left_while_its_client_sat_rounds_out_is_scaled_by_the_decay_per_round_missed(decay: float) -> None:
    options = {"keep": 0.2, "value_dtype": "f32", "residual_decay": decay, "keyframe_ratio": 0.0}
    fleet = make_fleet("ef-fedavg", options, TINY_MLP, clients=2, seed=6)
    run_round(fleet, 1, DATA, ADAM, seed=6)
    run_round(fleet, 2, DATA, ADAM, seed=6)
    left = [np.array(client.residual, copy=True) for client in fleet.clients]
    restart(fleet, "ef-fedavg", options)  # the round the residual was made travels with the device state
    run_round(fleet, 3, DATA, ADAM, seed=6, participants=[1])
    uploads: list[ClientUpdate] = []
    fold = fleet.server.fold
    fleet.server.fold = lambda r, update: (uploads.append(update), fold(r, update))[1]
    run_round(fleet, 4, DATA, ADAM, seed=6, participants=[0])
    client, layout = fleet.clients[0], fleet.server.layout
    delta = layout.flat(state_to_arrays(fleet.models[0])) - layout.flat(client.start)
    kept = np.ones(layout.size, dtype=bool)
    kept[uploads[0].payload.groups["update"].sparse.positions()] = False  # f32: nothing of a sent value is left
    carried = left[0] * np.float32(decay ** 1)  # one round missed
    assert np.array_equal(client.residual[kept], (delta + carried)[kept])
    assert not np.array_equal(carried, left[0]) or decay == 1.0


def test_a_residual_saved_before_its_version_was_kept_is_added_whole_once() -> None:
    options = {"keep": 0.2, "value_dtype": "f32", "residual_decay": 0.0, "keyframe_ratio": 0.0}
    fleet = make_fleet("ef-fedavg", options, TINY_MLP, clients=1, seed=7)
    for round_number in (1, 2, 3):
        run_round(fleet, round_number, DATA, ADAM, seed=7)
    client, device = fleet.clients[0], fleet.states[0]
    older = {k: v for k, v in device.committed(RUN_ID).items() if k != "ef/residual_base"}  # a state of before
    assert "ef/residual" in older and len(older) < len(device.committed(RUN_ID))
    device.write_pending(RUN_ID, 3, older)
    assert device.confirm(RUN_ID, 3)
    left = np.array(older["ef/residual"], copy=True)
    run_round(fleet, 4, DATA, ADAM, seed=7)  # the device trained round 3: nothing was missed
    layout = fleet.server.layout
    delta = layout.flat(state_to_arrays(fleet.models[0])) - layout.flat(client.start)
    kept = client.residual != 0
    assert np.array_equal(client.residual[kept], (delta + left)[kept]) and kept.sum() > 0
