"""Streaming aggregation does not depend on arrival order: the updates of a real round (trained by the in-process
driver), folded one by one in 20 random orders into a server half restored from the same state, give the same
state, bit for bit, every time, as the round folded in arrival order; the exact sums behind it are exact."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from fedge.algorithms.base import ModelLayout, ServerContext
from fedge.algorithms.loop import TrainSettings
from fedge.algorithms.registry import make_server
from fedge.models import build, state_to_arrays
from fedge.protocol.exact_sum import ExactSum
from fedge.simulation.inprocess import make_fleet, run_round
from tests.algo_helpers import TINY_MLP, client_data

CLIENTS = 6
DATA = client_data(TINY_MLP, CLIENTS, samples=24)
SGD = TrainSettings(epochs=1, batch_size=8, lr=0.05, optimizer="sgd")
INCREMENTAL = [("fedavg", {}), ("fedavg", {"upload": "delta"}), ("fedprox", {"mu": 0.01}), ("scaffold", {}),
               ("dssa-fedavg", {"warmup_rounds": 0}), ("dssa-scaffold", {"warmup_rounds": 0}),
               ("ef-fedprox", {}), ("ef-fedavg", {"keep": 0.1})]


def bits(state: tuple[dict[str, np.ndarray], dict[str, Any]]) -> tuple[dict[str, bytes], str]:
    arrays, meta = state
    return {name: array.tobytes() for name, array in arrays.items()}, repr(sorted(meta.items()))


@pytest.mark.parametrize(("name", "options"), INCREMENTAL, ids=[f"{n}{o or ''}" for n, o in INCREMENTAL])
def test_twenty_arrival_orders_give_one_state(name: str, options: dict[str, Any]) -> None:
    fleet = make_fleet(name, options, TINY_MLP, clients=CLIENTS, seed=4)
    run_round(fleet, 1, DATA, SGD, seed=4)  # state to start from: control variates, public model, masks
    before = fleet.server.state_dict()
    captured: list[Any] = []
    real = fleet.server.fold
    fleet.server.fold = lambda number, update: captured.append(update) or real(number, update)
    run_round(fleet, 2, DATA, SGD, seed=4)
    assert len(captured) == CLIENTS and len({u.num_samples for u in captured}) >= 1
    expected = bits(fleet.server.state_dict())
    orders = random.Random(0)
    for _ in range(20):
        order = list(captured)
        orders.shuffle(order)
        server = make_server(name, options, state_to_arrays(build(TINY_MLP)),
                             ServerContext(num_clients=CLIENTS, layout=ModelLayout.of(fleet.models[0]), seed=4))
        server.load_state_dict(*before)
        for update in order:
            server.fold(2, update)
        server.close_round(2)
        assert bits(server.state_dict()) == expected, [u.index for u in order]


def test_an_exact_sum_is_the_same_in_any_order_and_within_an_ulp_of_the_true_sum() -> None:
    rng = np.random.default_rng(3)
    terms = [rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30, 500) for _ in range(7)]
    terms.append(np.full(500, 1e300))
    terms.append(np.full(500, -1e300))
    sums = []
    for seed in range(5):
        order = list(range(len(terms)))
        random.Random(seed).shuffle(order)
        total = ExactSum(500)
        for i in order:
            total.add(terms[i])
        sums.append(total.value())
    assert all(np.array_equal(s, sums[0]) for s in sums)
    exact = np.array([math.fsum(t[j] for t in terms) for j in range(500)])
    assert np.all(np.abs(sums[0] - exact) <= 2 * np.spacing(np.abs(exact)))
    naive = sum(terms[i] for i in range(len(terms)))  # 1e300 - 1e300 in float order loses everything else
    assert not np.array_equal(naive, sums[0])


def test_an_exact_sum_refuses_what_it_cannot_hold() -> None:
    for bad in (np.inf, -np.inf, np.nan):
        with pytest.raises(ValueError, match="finite"):
            ExactSum(2).add(np.array([1.0, bad]))
    total = ExactSum(3)
    total.add(np.array([1.0, 2.0, 3.0]), at=None)
    total.add(np.array([5.0]), at=np.array([1]))
    assert total.value().tolist() == [1.0, 7.0, 3.0]


def test_the_slices_hold_the_exact_sum_of_terms_given_at_positions_whatever_their_magnitudes() -> None:
    from fractions import Fraction

    rng = np.random.default_rng(5)
    size, total = 400, ExactSum(400)
    expected = [Fraction(0)] * size
    for _ in range(6):
        at = np.sort(rng.choice(size, 150, replace=False))
        terms = rng.standard_normal(150) * 10.0 ** rng.integers(-40, 20, 150)  # most slices hold few of them
        total.add(terms, at)
        for position, term in zip(at, terms, strict=True):
            expected[position] += Fraction(float(term))
    held = [sum((Fraction(float(total.slices[k][j])) * Fraction(2) ** (32 * k) for k in total.slices), Fraction(0))
            for j in range(size)]
    assert held == expected


def test_the_slices_are_exact_at_the_ends_of_float64_subnormals_and_huge_terms_included() -> None:
    """Terms that are scaled up by more than 2^1023 (below 2^-990), subnormal, at 2^32 exactly, and huge (cut as they
    are): each slice still holds the exact sum."""
    from fractions import Fraction

    rng = np.random.default_rng(11)
    size, total = 64, ExactSum(64)
    expected = [Fraction(0)] * size
    edges = [5e-324, -5e-324, 2.0 ** -1074 * 12345, 1e-310, 2.0 ** -1000, 2.0 ** 32, -(2.0 ** 32), 2.0 ** 32 - 1,
             1e300, -1e300, 3.0]
    for scale in (1e-310, 1e-300, 1.0, 1e20, 1e300):
        terms = rng.standard_normal(size) * scale
        terms[: len(edges)] = rng.permutation(edges)
        total.add(terms)
        for position, term in enumerate(terms):
            expected[position] += Fraction(float(term))
    held = [sum((Fraction(float(total.slices[k][j])) * Fraction(2) ** (32 * k) for k in total.slices), Fraction(0))
            for j in range(size)]
    assert held == expected


@pytest.mark.parametrize("huge", [False, True])
def test_an_add_cut_into_parts_on_threads_holds_the_same_slices_as_one_in_one_piece(
        huge: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedge.plumbing.threads import PartThreads
    from fedge.protocol import exact_sum

    rng = np.random.default_rng(21)
    size = 3 * exact_sum.PART_TERMS + 12345
    terms = [rng.standard_normal(size) * 10.0 ** rng.integers(-12, 3, size) for _ in range(3)]
    if huge:  # terms of 2^32 and more: cut from the top, in their own units
        terms[1][::7] *= 1e30
    at = rng.choice(size, size - 1000, replace=False)
    sums = []
    for parts in (1, 3):
        monkeypatch.setattr(exact_sum, "_parts", (parts, PartThreads(parts)))
        total = ExactSum(size)
        for term in terms:
            total.add(term)
        total.add(terms[0][: at.size] * 3.0, at=at)
        assert exact_sum.parts_for(size) == parts
        sums.append(total)
    one, cut = sums
    assert sorted(one.slices) == sorted(cut.slices) and one.terms == cut.terms == 4
    for k in one.slices:
        assert np.array_equal(one.slices[k], cut.slices[k]), k
    assert np.array_equal(one.value(), cut.value())


def test_part_threads_finish_every_part_before_they_return_or_raise() -> None:
    import threading
    import time

    from fedge.plumbing.threads import PartThreads

    done: list[str] = []

    def slow() -> None:
        time.sleep(0.2)
        done.append(threading.current_thread().name)

    def failing() -> None:
        raise RuntimeError("part 0")

    runner = PartThreads(3)
    with pytest.raises(RuntimeError, match="part 0"):
        runner([failing, slow, slow])
    assert len(done) == 2 and all(name.startswith("exact-sum") for name in done)
