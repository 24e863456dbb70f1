"""The in-process driver plays the runtime's protocol objects and two-phase device state, not a copy of them."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fedge import codec
from fedge.algorithms.base import Payload
from fedge.algorithms.loop import TrainSettings
from fedge.algorithms.registry import REGISTRY
from fedge.client.state import DeviceState
from fedge.plumbing import without_fsync
from fedge.simulation.inprocess import RUN_ID, make_fleet, run_round
from tests.algo_helpers import TINY_MLP, client_data

DATA = client_data(TINY_MLP, 3, samples=24)
SGD = TrainSettings(epochs=1, batch_size=8, lr=0.05, optimizer="sgd")


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_round_goes_through_the_protocol_objects_and_commits_the_device_state() -> None:
    fleet = make_fleet("scaffold", {}, TINY_MLP, clients=3, seed=1)
    assert [w.client_index for w in fleet.welcomes] == [0, 1, 2]  # each agent registered with a hello
    run_round(fleet, 1, DATA, SGD, seed=1)
    assert fleet.coordinator.round == 1 and fleet.coordinator.current is None
    assert len(fleet.bytes_down) == len(fleet.bytes_up) == 3 and min(fleet.bytes_up) > 0
    for state, client in zip(fleet.states, fleet.clients, strict=True):
        assert not state.pending_path.exists()  # promoted by the commit
        assert same(state.committed(RUN_ID), client.state_dict())
    committed = fleet.states[2].committed_path.read_bytes()
    run_round(fleet, 2, DATA, SGD, seed=1, participants=[0, 1])
    assert fleet.states[2].committed_path.read_bytes() == committed  # not selected: its state is untouched
    assert fleet.coordinator.registry.by_index(2).last_accepted_round == 1


def test_the_client_half_carries_only_what_its_state_dict_put_on_disk() -> None:
    fleet = make_fleet("scaffold", {}, TINY_MLP, clients=2, seed=2)
    run_round(fleet, 1, DATA, SGD, seed=2)
    on_disk = fleet.states[0].committed(RUN_ID)
    fleet.clients[0].load_state_dict({})  # what the client half held in memory is forgotten ...
    seen: list[dict[str, np.ndarray]] = []
    run_round(fleet, 2, DATA, SGD, seed=2,
              inspect=lambda index, payload, model: seen.append(fleet.clients[index].state_dict()) if index == 0
              else None)
    assert same(seen[0], on_disk)  # ... and read back from the committed device state before the round


def test_an_update_the_coordinator_would_refuse_fails_the_round_with_its_reason() -> None:
    fleet = make_fleet("fedavg", {}, TINY_MLP, clients=2, seed=3)
    original = fleet.clients[1].make_update

    def foreign(round_number, model, stats):  # type: ignore[no-untyped-def]
        payload = original(round_number, model, stats)
        return Payload(groups={"model": codec.TensorGroup(dense={"not.in.the.model": np.zeros(3, np.float32)})},
                       meta=payload.meta)

    fleet.clients[1].make_update = foreign
    with pytest.raises(AssertionError, match="invalid-update: group 'model' names an unknown tensor"):
        run_round(fleet, 1, DATA, SGD, seed=3)


def test_device_state_is_forced_to_disk_except_in_a_simulation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    state = DeviceState(tmp_path / "a")
    state.write_pending("r", 1, {"x": np.zeros(2, np.float32)})
    assert state.confirm("r", 1)
    durable = len(calls)
    assert durable >= 3  # the file, its directory, and the directory after the promoting rename
    with without_fsync():
        state.write_pending("r", 2, {"x": np.ones(2, np.float32)})
        assert state.confirm("r", 2)
    assert len(calls) == durable and np.array_equal(state.committed("r")["x"], np.ones(2, np.float32))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_algorithm_refuses_an_update_its_aggregate_could_not_use(name: str) -> None:
    """An honest update passes (the driver would fail otherwise); the same update lacking a tensor (round 1), or
    under a group the algorithm does not take (round 2), is refused as invalid-update before any aggregate sees it,
    and its device's part in the round ends (its honest update would be a duplicate)."""
    import dataclasses

    from fedge.protocol.coordinator import Rejected

    options = {"warmup_rounds": 0} if name.startswith("dssa") else {}
    fleet = make_fleet(name, options, TINY_MLP, clients=2, seed=4)
    receive = fleet.coordinator.receive
    refusals: list[str] = []

    def tampering(peer: bytes, frame: bytes, now: float) -> list[object]:
        update = codec.decode(frame)
        if isinstance(update, codec.Update) and peer == b"c0":
            group_name, group = next(iter(update.groups.items()))
            if group.dense:
                dropped = dict(list(group.dense.items())[1:])
                lacking = {**update.groups, group_name: dataclasses.replace(group, dense=dropped)}
            else:
                lacking = {**{k: v for k, v in update.groups.items() if k != group_name}, "other": group}
            renamed = {**{k: v for k, v in update.groups.items() if k != group_name}, "other": group}
            bad = codec.encode(dataclasses.replace(update, groups=lacking if update.round == 1 else renamed))
            events = receive(peer, bad, now)
            refusals.extend(e.reason for e in events if isinstance(e, Rejected) and e.code == "invalid-update")
            return [e for e in events if not isinstance(e, Rejected)]
        return receive(peer, frame, now)

    fleet.coordinator.receive = tampering  # type: ignore[method-assign]
    for round_number in (1, 2):
        run_round(fleet, round_number, DATA[:2], SGD, seed=4)
    assert len(refusals) == 2, refusals  # one tampered copy in each of the two rounds
    assert all("lacks" in r or "does not take" in r for r in refusals), refusals
