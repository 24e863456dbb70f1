"""Mask helpers: exact retained counts, top-k equal to the stable-sort rule of docs/algorithms.md 4.3, mask CRCs."""

from __future__ import annotations

import math
import time
import zlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.codec import NonFinite, mask_crc, retained_count, topk_mask


def test_retained_count_uses_the_decimal_text() -> None:
    assert retained_count(10, keep=0.2) == retained_count(10, sparsity=0.8) == 2
    assert retained_count(10, sparsity="0.8") == 2 and retained_count(10, keep="0.2") == 2
    # In binary floating point 1 - 0.8 = 0.19999999999999996, which would give 10 - 8 = 2 only by luck:
    assert retained_count(1_146_720, keep=0.3) == 1_146_720 - math.floor(Fraction("0.7") * 1_146_720) == 344_016
    assert retained_count(7, sparsity=0.5) == 4 and retained_count(7, keep=0.5) == 4
    assert retained_count(0, keep=0.5) == 0 and retained_count(5, keep=1) == 5 and retained_count(5, sparsity=1) == 0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 10**7), digits=st.integers(0, 10**6), places=st.integers(1, 6), use_keep=st.booleans())
def test_retained_count_matches_exact_arithmetic(n: int, digits: int, places: int, use_keep: bool) -> None:
    frac = Fraction(digits % (10**places + 1), 10**places)
    text = f"{frac.numerator / frac.denominator:.{places}f}"
    p = 1 - Fraction(text) if use_keep else Fraction(text)
    got = retained_count(n, keep=text) if use_keep else retained_count(n, sparsity=text)
    assert got == n - math.floor(p * n)


@pytest.mark.parametrize("kwargs", [{}, {"keep": 0.5, "sparsity": 0.5}, {"keep": 1.5}, {"sparsity": -0.1},
                                    {"keep": "half"}, {"keep": True}, {"keep": float("nan")}])
def test_retained_count_rejects_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        retained_count(10, **kwargs)  # type: ignore[arg-type]


def stable_sort_mask(arrays: list[np.ndarray], k: int) -> np.ndarray:
    flat = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float64)
    order = np.argsort(-np.abs(flat), kind="stable")
    mask = np.zeros(flat.size, dtype=bool)
    mask[order[:k]] = True
    return mask


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4), levels=st.integers(1, 6),
       seed=st.integers(0, 2**32 - 1), k_frac=st.floats(0, 1))
def test_topk_mask_equals_the_stable_sort_rule(sizes: list[int], levels: int, seed: int, k_frac: float) -> None:
    rng = np.random.default_rng(seed)
    # Few distinct magnitudes and both signs (and -0.0), so ties at the threshold are the common case.
    arrays = [(rng.integers(-levels, levels + 1, s) * 0.5).astype(np.float32) for s in sizes]
    if arrays[0].size:
        arrays[0][0] = -0.0
    n = sum(sizes)
    k = int(round(k_frac * n))
    got = topk_mask(arrays, k)
    assert got.dtype == np.bool_ and int(got.sum()) == k
    assert np.array_equal(got, stable_sort_mask(arrays, k))


def test_topk_mask_is_fast_on_the_paper_cnn_size() -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in (864, 18_432, 73_728, 1_048_576, 5_120)]
    arrays[3][:1000] = 0.25  # a block of exact ties
    k = retained_count(1_146_720, keep=0.3)
    start = time.perf_counter()
    got = topk_mask(arrays, k)
    elapsed = time.perf_counter() - start
    assert np.array_equal(got, stable_sort_mask(arrays, k))
    assert elapsed < 1.0


def test_topk_mask_rejects_nan_and_bad_k() -> None:
    with pytest.raises(NonFinite):
        topk_mask([np.array([1.0, np.nan])], 1)
    with pytest.raises(ValueError):
        topk_mask([np.ones(3)], 4)


def test_mask_crc_is_crc32_of_big_endian_packbits() -> None:
    mask = np.zeros(8, dtype=bool)
    mask[[1, 6]] = True  # bits 0b01000010 = 0x42, as in docs/wire-format.md section 8.2
    assert mask_crc(mask) == zlib.crc32(b"\x42") == 0x4AD0CF31
    odd = np.ones(11, dtype=bool)  # padded with zero bits: ff e0
    assert mask_crc(odd) == zlib.crc32(b"\xff\xe0")
    with pytest.raises(ValueError):
        mask_crc(np.ones(3, dtype=np.uint8))
