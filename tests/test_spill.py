"""A round that holds its updates until it closes (round 1's bounds) keeps them on disk beyond a memory budget
(``coordinator.spill``): the round comes out bit for bit as if they had been kept in memory, and its files go with
the round."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from fedge.algorithms.base import ModelLayout, ServerContext
from fedge.algorithms.registry import make_server
from fedge.coordinator.config import RobustSection
from fedge.coordinator.rundir import RunDir
from fedge.coordinator.spill import Spill
from fedge.coordinator.trust import SessionTrust
from fedge.models import build, state_to_arrays
from fedge.protocol.influence import Influence, InfluenceLimits
from fedge.protocol.server_half import Aggregation
from tests.algo_helpers import TINY_MLP, same_arrays
from tests.influence_cases import attacker, ef_update, server_and_uploads
from tests.simfleet import InProcessSessions


def fedavg_round(keep: Spill | None) -> tuple[dict[str, np.ndarray], Aggregation]:
    server, initial, honest = server_and_uploads(honest=6)
    aggregation = Aggregation(server, 1, Influence(InfluenceLimits()), keep=None if keep is None else keep.keep)
    for update in [attacker(initial, 6), *honest]:
        aggregation.fold(update)
    if keep is not None:  # held: every float value mapped from a file, none kept in memory
        assert keep.spilled == 7 and keep.kept_bytes == 0
        assert all(isinstance(a, np.memmap) for u, _ in aggregation.held for a in u.payload.groups["model"].dense.values())
    metrics = aggregation.close()
    assert not aggregation.held
    assert metrics["robust_capped"] == 1 and metrics["robust_clipped"] == 1
    return server.model, aggregation


def test_a_held_round_spilled_to_disk_is_the_round_kept_in_memory_bit_for_bit(tmp_path: Path) -> None:
    kept, in_memory = fedavg_round(None)
    spill = Spill(tmp_path / "spill", budget=0)
    spilled, on_disk = fedavg_round(spill)
    assert same_arrays(kept, spilled)
    assert [b.record() for b in in_memory.bounded] == [b.record() for b in on_disk.bounded]
    assert len(list((tmp_path / "spill").iterdir())) == 7  # one file per update
    spill.clear()
    assert not (tmp_path / "spill").exists() and spill.spilled == 0


def test_sparse_values_and_positions_are_spilled_too_and_fold_as_they_arrived(tmp_path: Path) -> None:
    model = build(TINY_MLP, seed=0)
    context = ServerContext(num_clients=6, layout=ModelLayout.of(model))
    results = []
    for spill in (None, Spill(tmp_path / "spill", budget=0)):
        server = make_server("ef-fedavg", {"keep": 1.0, "value_dtype": "f32"}, state_to_arrays(model), context)
        rng = np.random.default_rng(4)
        aggregation = Aggregation(server, 1, Influence(InfluenceLimits()), keep=None if spill is None else spill.keep)
        for index in range(6):
            aggregation.fold(ef_update(server, index, 0, rng, 50.0 if index == 5 else 0.01))
        if spill is not None:
            assert spill.spilled == 6
            sections = [u.payload.groups["update"].sparse for u, _ in aggregation.held]
            assert all(isinstance(s.values, np.memmap) and isinstance(s.indices, np.memmap) for s in sections)
        aggregation.close()
        results.append(server.evaluation_arrays())
    assert same_arrays(results[0], results[1])


def test_the_budget_keeps_the_first_updates_in_memory_and_spills_the_rest(tmp_path: Path) -> None:
    server, initial, honest = server_and_uploads(honest=4)
    size = sum(a.nbytes for a in honest[0].payload.groups["model"].dense.values())
    spill = Spill(tmp_path / "spill", budget=2 * size)
    aggregation = Aggregation(server, 1, Influence(InfluenceLimits()), keep=spill.keep)
    for update in honest:
        aggregation.fold(update)
    kinds = [isinstance(next(iter(u.payload.groups["model"].dense.values())), np.memmap) for u, _ in aggregation.held]
    assert kinds == [False, False, True, True] and spill.kept_bytes == 2 * size and spill.spilled_bytes == 2 * size


def test_a_session_removes_what_an_interrupted_round_left_on_disk(tmp_path: Path) -> None:
    leftover = tmp_path / "spill"
    leftover.mkdir()
    (leftover / "0.npy").write_bytes(b"half a round")
    SessionTrust(RobustSection(), 0, RunDir(tmp_path))
    assert not leftover.exists()


def test_a_session_whose_round_1_spills_ends_as_one_that_kept_it_in_memory(
        sessions: InProcessSessions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A simulated session played here with the memory budget at 0 (every held update of round 1 waits on disk)
    gives the records and model of the same session with the default budget, and leaves no spill behind."""
    from fedge.coordinator import spill
    from tests.simfleet import overrides, records

    sets = overrides("fedavg", 1.0, "simulated", "inline", ("run.rounds=2",))
    caplog.set_level(logging.INFO, logger="fedge.coordinator")
    sessions.run(sets, name="kept")
    assert "waited on disk" not in caplog.text
    monkeypatch.setattr(spill, "HELD_IN_MEMORY_BYTES", 0)
    sessions.run(sets, name="spilled")
    assert "round 1: 6 held update(s)" in caplog.text and "waited on disk" in caplog.text
    kept, spilled = records(tmp_path / "kept"), records(tmp_path / "spilled")
    assert kept["metrics"] == spilled["metrics"] and kept["clients"] == spilled["clients"]
    assert all(same_arrays({k: v}, {k: spilled["model"][k]}) for k, v in kept["model"].items())
    assert not (tmp_path / "spilled" / "spill").exists()
