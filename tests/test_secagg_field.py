"""The field secure aggregation sums in (``secagg.field``): a sum of n devices' quantised values never wraps, at
any width, and stochastic rounding is unbiased."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.secagg import field


@given(st.integers(8, 62), st.integers(1, 10_000))
@settings(max_examples=80, deadline=None)
def test_the_levels_leave_room_for_every_devices_extremes(bits: int, devices: int) -> None:
    if devices * 3 > 1 << bits:
        with pytest.raises(ValueError, match="raise secagg.bits"):
            field.levels_for(bits, devices)
        return
    levels = field.levels_for(bits, devices)
    assert devices * (2 * levels + 1) <= 1 << bits
    assert levels == field.MAX_LEVELS or 1 << bits < devices * (2 * (levels + 1) + 1)  # the most that fit, or 2^52
    extremes = np.full(devices, levels, np.int64)
    for sign in (1, -1):
        total = np.zeros(1, np.uint64)
        for value in sign * extremes:
            total = field.add(total, field.lift(np.array([value]), bits), bits)
        assert int(field.signed(total, bits)[0]) == sign * devices * levels


def test_stochastic_rounding_is_unbiased_and_stays_on_the_grid() -> None:
    rng = np.random.default_rng(0)
    values = np.array([0.123, -0.456, 0.999, -1.5, 2.0])
    draws = np.stack([field.quantise(values, 1.0, 10, rng) for _ in range(20_000)])
    assert draws.min() >= -10 and draws.max() <= 10
    means = draws.mean(axis=0)
    assert np.allclose(means, [1.23, -4.56, 9.99, -10, 10], atol=0.03)  # clipped to [-1, 1] first
    assert np.allclose(field.dequantise(np.round(means).astype(np.int64), 1.0, 10), [0.1, -0.5, 1.0, -1.0, 1.0])


def test_a_wide_field_never_wraps_and_a_non_finite_change_is_refused() -> None:
    """Above 2^52 levels float64 cannot round exactly: the levels stop there, and n devices at the clip sum to
    exactly n times it at every width (a float bound let 59 bits and 5 devices wrap to minus the clip)."""
    rng = np.random.default_rng(0)
    for bits in (53, 57, 59, 62):
        for devices in (1, 5, 299):
            levels = field.levels_for(bits, devices)
            total = np.zeros(1, np.uint64)
            for _ in range(devices):
                total = field.add(total, field.lift(field.quantise(np.array([1.0]), 1.0, levels, rng), bits), bits)
            assert int(field.signed(total, bits)[0]) == devices * levels
    with pytest.raises(ValueError, match="NaN or infinite"):
        field.quantise(np.array([0.1, np.nan]), 1.0, 10, rng)
