"""Shamir sharing over GF(2^127 - 1): any t shares give the secret back, t - 1 say nothing of it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.secagg import shamir


@st.composite
def sharings(draw: st.DrawFn) -> tuple[int, int, list[int]]:
    k = draw(st.integers(2, 12))
    t = draw(st.integers(2, k))
    points = draw(st.lists(st.integers(1, 10**6), min_size=k, max_size=k, unique=True))
    return draw(st.integers(0, shamir.PRIME - 1)), t, points


@given(sharings(), st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_any_threshold_of_shares_gives_the_secret_back(case: tuple[int, int, list[int]], chance: object) -> None:
    secret, t, points = case
    shares = shamir.share(secret, t, points)
    chosen = chance.sample(points, t)  # type: ignore[attr-defined]
    assert shamir.reconstruct({x: shares[x] for x in chosen}, t) == secret


@given(sharings())
@settings(max_examples=60, deadline=None)
def test_fewer_than_the_threshold_miss_the_secret(case: tuple[int, int, list[int]]) -> None:
    """t - 1 shares interpolated as a polynomial of degree t - 2 miss the secret: the sharing polynomial has degree
    t - 1 (one of lower degree would give the secret away to t - 1 colluders)."""
    secret, t, points = case
    shares = shamir.share(secret, t, points)
    assert shamir.reconstruct({x: shares[x] for x in points[:t - 1]}, t - 1) != secret


def test_one_share_is_uniform_whatever_the_secret() -> None:
    """The first share of 2-of-2 sharings of a fixed secret spreads evenly over the field (16 bins, chi-square)."""
    counts = [0] * 16
    for _ in range(3200):
        value = shamir.share(7, 2, [1, 2])[1]
        counts[value * 16 // shamir.PRIME] += 1
    chi2 = sum((c - 200) ** 2 / 200 for c in counts)
    assert chi2 < 37.7  # p = 0.001 with 15 degrees of freedom


@given(st.binary(min_size=1, max_size=64), st.integers(2, 6))
@settings(max_examples=40, deadline=None)
def test_byte_strings_are_shared_chunk_by_chunk(secret: bytes, t: int) -> None:
    points = list(range(1, t + 3))
    shares = shamir.share_bytes(secret, t, points)
    assert shamir.reconstruct_bytes({x: shares[x] for x in points[-t:]}, t, len(secret)) == secret


def test_too_few_shares_and_bad_points_are_refused() -> None:
    shares = shamir.share(5, 3, [1, 2, 3])
    with pytest.raises(ValueError, match="3 needed"):
        shamir.reconstruct({1: shares[1], 2: shares[2]}, 3)
    with pytest.raises(ValueError, match="distinct"):
        shamir.share(5, 2, [1, 1, 2])
    with pytest.raises(ValueError, match="distinct"):
        shamir.share(5, 2, [0, 1])
