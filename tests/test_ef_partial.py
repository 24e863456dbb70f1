"""ef when most clients sit out most rounds (docs/ef.md, "Partial participation"): what the coordinator believes each
client holds is what the client holds, through misses, restarts of either side, a resume and a lost replica; a
client back after missed rounds costs one catch-up; no dense first sync; keyframes at full participation only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fedge.algorithms import ef, fedprox
from fedge.algorithms.base import ModelLayout, Payload, ServerContext
from fedge.algorithms.ef_meta import EfTask, Source
from fedge.algorithms.keyframes import Belief, KeyframeClock, Replica, public_crc
from fedge.models import build, state_to_arrays
from fedge.simulation.inprocess import RUN_ID, Fleet, make_fleet, run_round, through_codec
from tests.algo_helpers import ADAM, TINY_MLP, client_data, same_arrays

CLIENTS = 6
DATA = client_data(TINY_MLP, CLIENTS, samples=32)
DEFAULT = {"keep": 0.3, "value_dtype": "ternary", "mu": 0.01}  # the embedded default's settings


def committed_version(fleet: Fleet, index: int) -> int:
    state = fleet.states[index].committed(RUN_ID)
    return int(state["ef/version"]) if "ef/version" in state else 0  # no replica yet: it rebuilds the start


def assert_beliefs_match_devices(fleet: Fleet) -> None:
    """For every client, selected this round or not: the keyframe version the coordinator believes it holds is the
    one in its committed device state, and what the coordinator would send it brings that state, bit for bit, to
    this round's public model (``Replica.sync`` checks versions and CRCs)."""
    model = fleet.server.model
    for index in range(len(fleet.clients)):
        belief, held = model.believed(index)
        if belief is Belief.FORGOTTEN:  # it believes nothing: the next downlink is dense
            continue
        believed = held if belief is Belief.HOLDS else 0
        assert believed == committed_version(fleet, index), index
        if model.chain(believed) is None:
            continue  # beyond the history: a dense copy, which holds whatever the device had
        replica = Replica("f16")
        replica.initial = fleet.initial
        replica.load_state_dict(fleet.states[index].committed(RUN_ID))
        groups, meta = model.downlink(index)
        sent, _ = through_codec(Payload(groups=groups, meta=meta), "task", 0)  # as the device decodes it
        assert same_arrays(replica.sync(sent.groups, EfTask.from_meta(sent.meta)), model.public)


def restart_devices(fleet: Fleet, options: dict[str, Any]) -> None:
    """Every device restarts: a new client half given only the initial model and its committed state."""
    config = ef.make_config(fedprox, options)
    fleet.clients = [ef.Client(config, index, fedprox) for index in range(len(fleet.clients))]
    for client in fleet.clients:
        client.initial_model(fleet.initial)


def resume_coordinator(fleet: Fleet, options: dict[str, Any]) -> None:
    """The coordinator restarts from its checkpoint (``state_dict``), as ``coordinator start --resume`` does."""
    arrays, meta = fleet.server.state_dict()
    server = ef.Server(ef.make_config(fedprox, options), fleet.initial, fleet.server.context, fedprox)
    server.load_state_dict({k: np.array(v, copy=True) for k, v in arrays.items()}, meta)
    assert same_arrays(server.public, fleet.server.public) and server.model.crc == fleet.server.model.crc
    fleet.server = server


def test_what_the_coordinator_believes_each_client_holds_never_differs_from_what_it_holds() -> None:
    options = {**DEFAULT, "keyframe_ratio": 1.0, "history": 2}
    fleet = make_fleet("ef-fedprox", options, TINY_MLP, clients=CLIENTS, seed=3)
    rng = np.random.default_rng(3)
    kinds: set[str] = set()
    keyframes = 0

    def trains_from_the_public_model(index: int, payload: Payload, model: torch.nn.Module) -> None:
        assert same_arrays(fleet.clients[index].start, fleet.server.public)
        assert same_arrays(state_to_arrays(model), fleet.server.public)
        kinds.update(name.split("-")[0] for name in payload.groups)

    for round_number in range(1, 19):
        if round_number == 7:
            resume_coordinator(fleet, options)
        if round_number == 11:
            restart_devices(fleet, options)
        if round_number == 13:  # client 5 reports a lost replica: its state is gone, the coordinator forgets it
            fleet.states[5].committed_path.unlink(missing_ok=True)
            fleet.server.forget(5)
        chosen = sorted(rng.choice(CLIENTS, size=2, replace=False).tolist())
        if round_number == 14:
            chosen = sorted({*chosen[:1], 5})
        metrics = run_round(fleet, round_number, DATA, ADAM, seed=3, participants=chosen,
                            inspect=trains_from_the_public_model)
        keyframes += metrics["ef_keyframe"]
        assert_beliefs_match_devices(fleet)
    assert 3 <= keyframes < 18  # keyframes came, but not every round
    assert kinds >= {"delta", "catchup", "public"}  # chains, catch-ups and the dense copy of the forgotten client


def downlink_size(options: dict[str, Any], rounds: int) -> tuple[int, list[str], int]:
    """Clients 0 and 1 train every round; client 2 comes at round ``rounds + 1``: its Task's size and groups, and
    the size of an update packet of that round."""
    fleet = make_fleet("ef-fedprox", options, TINY_MLP, clients=3, seed=4)
    for round_number in range(1, rounds + 1):
        run_round(fleet, round_number, DATA, ADAM, seed=4, participants=[0, 1])
    seen: list[list[str]] = []
    before = len(fleet.bytes_down), len(fleet.bytes_up)
    run_round(fleet, rounds + 1, DATA, ADAM, seed=4, participants=[2],
              inspect=lambda i, p, m: seen.append(sorted(p.groups)))
    return fleet.bytes_down[before[0]], seen[0], fleet.bytes_up[before[1]]


def test_a_client_back_after_missed_rounds_gets_one_catch_up_not_a_chain() -> None:
    catch_up, groups, update = downlink_size({**DEFAULT, "keyframe_ratio": 1000.0}, rounds=6)
    assert groups == ["catchup"]
    assert catch_up < 1.5 * update  # about one sparse update (the same top fraction, the same encoding)
    chain, chain_groups, _ = downlink_size({**DEFAULT, "keyframe_ratio": 0.0}, rounds=6)
    assert chain_groups == [f"delta-{v}" for v in range(1, 7)]  # a keyframe every round: the chain
    assert chain > 3 * catch_up


def test_keyframes_every_round_at_full_participation_and_by_the_ratio_or_the_round_bound_otherwise() -> None:
    full = KeyframeClock(clients=10, ratio=6.0)
    assert all(full.due(10) for _ in range(5))
    partial = KeyframeClock(clients=10, ratio=6.0)
    assert [partial.due(3) for _ in range(15)] == [False] * 13 + [True, False]  # 14 x 3 >= 6 x 7
    nearly = KeyframeClock(clients=10, ratio=6.0)
    assert [nearly.due(9) for _ in range(3)] == [True] * 3  # one absent client: 9 >= 6 x 1
    every = KeyframeClock(clients=10, ratio=0.0)
    assert all(every.due(1) for _ in range(3))
    capped = KeyframeClock(clients=10, ratio=6.0, max_rounds=15)  # 1 of 10 a round: the bound of 15 rounds comes first
    assert [capped.due(1) for _ in range(30)] == ([False] * 14 + [True]) * 2


def test_the_first_task_rebuilds_the_initial_model_and_a_mismatch_falls_back_to_a_dense_copy() -> None:
    config = ef.make_config(fedprox, DEFAULT)
    model = build(TINY_MLP, seed=5)
    initial = state_to_arrays(model)
    context = ServerContext(num_clients=2, layout=ModelLayout.of(model), seed=5)
    server = ef.Server(config, initial, context, fedprox)
    first = server.downlink(1, 0)
    described = EfTask.from_meta(first.meta)
    assert dict(first.groups) == {} and described.source is Source.CHAIN and described.start == 0
    client = ef.Client(config, 0, fedprox)
    client.initial_model(initial)
    client.on_receive(1, first, build(TINY_MLP))
    assert same_arrays(client.start, server.public) and public_crc(client.start) == described.start_crc

    other = ef.Client(config, 1, fedprox)
    other.initial_model(state_to_arrays(build(TINY_MLP, seed=6)))  # another torch would build other weights
    with pytest.raises(RuntimeError, match="initial model rebuilt on this device differs"):
        other.on_receive(1, server.downlink(1, 1), build(TINY_MLP))
    server.forget(1)  # the coordinator's answer to the failed round
    dense = server.downlink(2, 1)
    assert sorted(dense.groups) == ["public"] and dense.groups["public"].value_dtype == "f16"
    other.on_receive(2, dense, build(TINY_MLP))
    assert same_arrays(other.start, server.public)

    saved = ServerContext(num_clients=2, layout=ModelLayout.of(model), seed=5, initial_from_seed=False)
    restored = ef.Server(config, initial, saved, fedprox)  # model.init: not rebuildable
    assert sorted(restored.downlink(1, 0).groups) == ["public"]


def test_the_coordinators_model_is_the_keyframe_plus_its_residual_and_the_public_model_approximates_it() -> None:
    fleet = make_fleet("ef-fedprox", {**DEFAULT, "keyframe_ratio": 1000.0}, TINY_MLP, clients=4, seed=7)
    metrics = {}
    for round_number in range(1, 5):
        metrics = run_round(fleet, round_number, DATA, ADAM, seed=7, participants=[round_number % 4])
    server = fleet.server
    exact = server.layout.flat(server.evaluation_arrays())
    assert np.array_equal(exact, server.layout.flat(server.model.key) + server.residual)
    public, key = server.layout.flat(server.public), server.layout.flat(server.model.key)
    assert not np.array_equal(public, key)  # no keyframe since round 0: the public model is K plus a catch-up
    error = np.linalg.norm(exact - public) / np.linalg.norm(exact - key)
    assert 0 < error < 1 and error == pytest.approx(metrics["ef_public_error"], rel=1e-5)


def test_clients_that_hold_the_same_keyframe_get_one_body_encoded_once() -> None:
    from fedge import codec
    from fedge.coordinator.downlinks import DownlinkBodies

    def frames(fleet: Fleet, round_number: int) -> DownlinkBodies:
        bodies = DownlinkBodies()
        for index in range(4):
            payload = fleet.server.downlink(round_number, index)
            bodies.frame(codec.Task(run_id="r", round=round_number, sender="c", groups=dict(payload.groups),
                                    meta=dict(payload.meta), committed_round=round_number - 1,
                                    last_accepted_round=0, deadline_s=30.0))
        return bodies

    shared = make_fleet("ef-fedprox", {**DEFAULT, "keyframe_ratio": 1000.0}, TINY_MLP, clients=4, seed=8)
    for round_number, chosen in ((1, [0, 1]), (2, [0]), (3, [1])):
        run_round(shared, round_number, DATA, ADAM, seed=8, participants=chosen)
    once = frames(shared, 4)  # no keyframe since the start: every client, new or not, gets the one catch-up
    assert (once.encoded, once.shared) == (1, 3)
    chains = make_fleet("ef-fedprox", {**DEFAULT, "keyframe_ratio": 0.0}, TINY_MLP, clients=4, seed=8)
    for round_number, chosen in ((1, [0, 1, 2, 3]), (2, [0, 1]), (3, [0])):
        run_round(chains, round_number, DATA, ADAM, seed=8, participants=chosen)
    per_keyframe = frames(chains, 4)  # clients 2 and 3 hold the same keyframe; 0 and 1 others
    assert (per_keyframe.encoded, per_keyframe.shared) == (3, 1)


@pytest.mark.parametrize("value_dtype", ["ternary", "f16"])
def test_the_checkpoint_keeps_each_delta_exactly_and_compactly_and_reads_the_older_form(value_dtype: str) -> None:
    fleet = make_fleet("ef-fedprox", {**DEFAULT, "value_dtype": value_dtype, "keyframe_ratio": 0.0}, TINY_MLP,
                       clients=3, seed=8)
    for round_number in range(1, 4):
        run_round(fleet, round_number, DATA, ADAM, seed=8)
    model = fleet.server.model
    arrays, meta = model.state_dict("")
    size = model.layout.size
    assert len(model.history) == 3
    for version in model.history:
        assert arrays[f"history/{version}/mask"].nbytes == -(-size // 8)  # one bit a coordinate, not 4 bytes a kept one
        assert (f"history/{version}/signs" in arrays) == (value_dtype == "ternary")  # one bit a ternary value
    older = {k: v for k, v in arrays.items() if not k.endswith(("/mask", "/signs", "/magnitudes"))}
    for version, delta in model.history.items():  # a checkpoint written before the compact form
        older.pop(f"history/{version}/values", None)
        older[f"history/{version}/indices"], older[f"history/{version}/values"] = delta.indices, delta.values
    for stored in (arrays, older):
        server = ef.Server(fleet.server.config, fleet.server.public, fleet.server.context, fedprox)
        server.model.load_state_dict(stored, meta, "")
        for version, delta in model.history.items():
            restored = server.model.history[version]
            assert np.array_equal(restored.indices, delta.indices) and restored.indices.dtype == delta.indices.dtype
            assert np.array_equal(restored.values, delta.values) and restored.values.dtype == np.float32
        assert public_crc(server.model.public) == public_crc(model.public)
