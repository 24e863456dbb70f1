"""A change on the round's grid (``secagg.encoding``): the survivors' summed words give back the mean of their
quantised changes exactly, an unbiased estimate of their mean change; a change beyond the clip range is clipped;
a grid that makes no sense is refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.secagg import field
from fedge.secagg.encoding import Grid, grid_for, grid_of, rounding_rng, task_settings


def test_the_summed_words_are_the_mean_of_the_quantised_changes() -> None:
    grid = grid_for(16, 0.5, [6, 4], devices=8)
    rng = np.random.default_rng(0)
    changes = [rng.normal(0, 0.1, grid.size) for _ in range(8)]
    words = [grid.encode(c, rounding_rng(3, 2, i, 0)) for i, c in enumerate(changes)]
    total = np.zeros(grid.size, np.uint64)
    for w in words:
        total = field.add(total, w, grid.bits)
    step = grid.clip_per_coordinate() / grid.levels
    integers = [field.signed(w, grid.bits) for w in words]
    assert np.array_equal(grid.mean(total, 8) * 8 / step, np.sum(integers, axis=0))  # exact, no wrap
    assert np.max(np.abs(grid.mean(total, 8) - np.mean(changes, axis=0))) <= step.max()


def test_stochastic_rounding_makes_the_mean_unbiased() -> None:
    grid = grid_for(20, 1.0, [3], devices=2)
    change = np.array([0.3e-5, -0.7e-5, 0.123456])
    draws = np.stack([grid.mean(grid.encode(change, rounding_rng(0, 1, 0, k)), 1) for k in range(4000)])
    step = 1.0 / grid.levels
    assert np.allclose(draws.mean(axis=0), change, atol=4 * step / np.sqrt(4000))


def test_a_change_beyond_the_clip_range_counts_as_the_clip() -> None:
    grid = grid_for(16, 0.01, [2], devices=4)
    huge = np.array([1e6, -1e6])
    assert np.allclose(grid.mean(grid.encode(huge, rounding_rng(0, 1, 0, 0)), 1), [0.01, -0.01])


def test_the_same_draws_for_the_same_seed_round_client_and_attempt() -> None:
    grid = grid_for(16, 1.0, [100], devices=3)
    change = np.linspace(-0.5, 0.5, 100)
    assert np.array_equal(grid.encode(change, rounding_rng(1, 2, 3, 0)), grid.encode(change, rounding_rng(1, 2, 3, 0)))
    assert not np.array_equal(grid.encode(change, rounding_rng(1, 2, 3, 0)),
                              grid.encode(change, rounding_rng(1, 2, 3, 1)))


def test_the_tasks_settings_round_trip_and_nonsense_is_refused() -> None:
    grid = grid_for(16, 0.05, [5, 7], devices=10)
    settings = task_settings(grid, 0.6, 50, 9, 0)
    assert grid_of(settings, [5, 7]) == grid
    for bad in ({**settings, "bits": 70}, {**settings, "levels": 0}, {**settings, "levels": 1 << 20},
                {**settings, "clip": [0.05]}, {**settings, "clip": [0.05, -1.0]}, {**settings, "threshold": 0.5}):
        with pytest.raises(ValueError):
            grid_of(bad, [5, 7])
    with pytest.raises(ValueError, match="raise secagg.bits"):
        grid_for(8, 0.05, [5], devices=200)
    with pytest.raises(ValueError, match="covers 5"):
        Grid(16, 100, (0.1,), (5,)).encode(np.zeros(4), rounding_rng(0, 0, 0, 0))
