"""One hostile update never changes a round it was refused from, in every mode.

Each cell sends one mutation of an honest update (tests/hostile.py) from one device of a short session
(tests/hostile_rounds.py: the real Session and round, frames in, server state out) and checks three things: no
exception escapes the session; a refused update is refused with a warning naming the device; and the closed
round's server state (the server half's arrays and meta, the server step's state) is byte for byte the state of
the same round closed without that update (a ``bounded`` claim: with the honest update claiming the weight cap; a
``harmless`` field: with the honest update; tests/hostile.py lists the others). Honest frames are recorded once per mode and replayed, so a cell
trains nothing. Under central DP the noise generator is pinned, so equal clipped sums close to equal bytes; a
securely aggregated mode (and distributed noise, each device's noise seeded) is played live, the attacker's stage
message rewritten in flight, against the round in which that device did not send it. A combination the
configuration refuses is a passing cell that asserts the refusal. The modes, the comparisons and the verdict are
tests/hostile_matrix.py's; this file runs a selection of the matrix (``CORE``, ``FULL``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fedge import codec
from fedge.coordinator.config import ConfigError
from tests.hostile import MUTATIONS, STAGE_MUTATIONS, Mutation, StageMutation, mutation, stage_frames
from tests.hostile_matrix import (
    MODES,
    REFUSED_COMBINATIONS,
    SECURE_MODES,
    SECURE_PLAIN,
    Recorded,
    refused_plan,
    verdict,
)
from tests.hostile_rounds import Mode

# one mutation of each class (a group, a tensor, a sparse index, a dtype, a non-finite value, a count, a header
# field, a replay, a frame) in every mode; every mutation in the modes that stand for the rest (the full matrix:
# benchmarks/attacks.py --hostile)
CORE = ("missing-group", "extra-tensor", "out-of-range-index", "int32", "nan", "zero-samples", "previous-round",
        "replay-earlier", "truncated")
FULL = ("fedavg", "ef-fedprox", "dssa-fedavg", "fedavg+multi-krum", "fedavg+central-dp", "ef-fedavg+async")


def cell(mode: Mode, *values: object, name: str) -> object:
    """One cell's parameters, in the xdist group of the mode's honest recording: under pytest-xdist a mode's cells
    run in one worker, which records the mode and replays its expected rounds once."""
    group = pytest.mark.xdist_group(mode.records or mode.name)
    return pytest.param(mode, *values, id=f"{mode.name}-{name}", marks=group)


CELLS = [cell(m, u, name=u.name) for m in MODES for u in MUTATIONS if m.name in FULL or u.name in CORE]
STAGES = [cell(m, s, name=s.name) for m in SECURE_MODES for s in STAGE_MUTATIONS]
MASKED = [cell(m, name, name=name) for m in SECURE_MODES for name in SECURE_PLAIN]


@pytest.fixture(scope="module")
def recorded() -> Iterator[Recorded]:
    """The honest recordings and expected rounds, kept for the module (numpy's BLAS and torch on one thread, as in
    the coordinator's process: conftest's ``one_thread``)."""
    yield Recorded()


@pytest.mark.parametrize(("mode", "mutation"), CELLS)
def test_hostile_update(recorded: Recorded, mode: Mode, mutation: Mutation) -> None:
    closed, expected, expect = recorded.cell(mode, mutation)
    problem = verdict(closed, expected, expect)
    assert not problem, f"{mode.name} x {mutation.name}: {problem}"


@pytest.mark.parametrize(("mode", "stage"), STAGES)
def test_hostile_stage(recorded: Recorded, mode: Mode, stage: StageMutation) -> None:
    closed = recorded.live(mode, stage.kind, stage_frames(stage, "agent-01"))
    problem = verdict(closed, recorded.live_expected(mode, stage.kind, stage.expect), stage.expect)
    assert not problem, f"{mode.name} x {stage.name}: {problem}"


@pytest.mark.parametrize(("mode", "name"), MASKED)
def test_hostile_masked_update(recorded: Recorded, mode: Mode, name: str) -> None:
    plain = mutation(name)
    assert isinstance(plain.expect, str)
    closed = recorded.live(mode, codec.Update, lambda frame: plain.make(frame, []))
    problem = verdict(closed, recorded.live_expected(mode, codec.Update, plain.expect), plain.expect)
    assert not problem, f"{mode.name} x {name}: {problem}"


@pytest.mark.parametrize("sets", REFUSED_COMBINATIONS, ids=lambda s: "+".join(x.split("=")[1] for x in s))
def test_refused_combination(sets: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError):
        refused_plan(sets)
