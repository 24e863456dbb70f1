"""The index field follows docs/wire-format.md 5.1 bit for bit, and non-canonical streams are rejected."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.codec import Malformed
from fedge.codec.indexcode import (
    BITMAP,
    RICE,
    RICE_COMPLEMENT,
    decode_segment,
    encode_segment,
    rice_decode,
    rice_encode,
)


def reference_rice(positions: list[int], r: int) -> tuple[bytes, bytes]:
    """Section 5.1 written out literally with Python strings of bits."""
    hi_bits, lo_bits, previous = "", "", -1
    for p in positions:
        gap = p - previous - 1
        previous = p
        hi_bits += "0" * (gap >> r) + "1"
        lo_bits += format(gap & ((1 << r) - 1), f"0{r}b") if r else ""

    def pack(bits: str) -> bytes:
        bits += "0" * (-len(bits) % 8)
        return bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8))

    return pack(hi_bits), pack(lo_bits)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 3000), density=st.floats(0.0005, 0.6), r=st.integers(0, 30), seed=st.integers(0, 2**32 - 1))
def test_rice_streams_match_the_spec(n: int, density: float, r: int, seed: int) -> None:
    positions = np.flatnonzero(np.random.default_rng(seed).random(n) < density)
    hi, lo = rice_encode(positions, r)
    assert (hi, lo) == reference_rice(positions.tolist(), r)
    assert np.array_equal(rice_decode(hi, lo, positions.size, r, n, "t"), positions)


@pytest.mark.parametrize("r", range(1, 31))
def test_every_rice_parameter_decodes_groups_of_fields_at_any_count(r: int) -> None:
    """The remainder fields are read 8 at a time for r <= 8 and one by one above: both at every tail length."""
    rng = np.random.default_rng(r)
    for count in (1, 7, 8, 9, 1001):
        gaps = rng.integers(0, 1 << min(r + 2, 40), count)
        positions = np.cumsum(gaps + 1) - 1
        hi, lo = rice_encode(positions, r)
        assert (hi, lo) == reference_rice(positions.tolist(), r)
        assert np.array_equal(rice_decode(hi, lo, count, r, int(positions[-1]) + 1, "t"), positions)


def test_worked_example_of_the_spec() -> None:
    assert rice_encode(np.array([1, 6]), 1) == (b"\x90", b"\x80")


@pytest.mark.parametrize(("hi", "lo", "count", "why"), [
    (b"\x90\x00", b"\x80", 2, "padding"),  # a byte after the last 1 bit
    (b"\x91", b"\x80", 2, "codes 3"),  # one 1 bit too many
    (b"\x90", b"\x81", 2, "padding"),  # non-zero padding in the remainder stream
    (b"\x90", b"\x80\x00", 2, "remainder"),  # remainder stream too long
    (b"\x00\x00\x01", b"\x80", 2, "longer"),  # quotient stream longer than any valid one
    (b"\x80\x01", b"\x80", 2, "outside"),  # decodes past the tensor's end
])
def test_non_canonical_rice_streams_are_rejected(hi: bytes, lo: bytes, count: int, why: str) -> None:
    with pytest.raises(Malformed, match=why):
        rice_decode(hi, lo, count, 1, 16, "t")


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 5000), density=st.floats(0, 1), run=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_segments_round_trip_whatever_coding_the_encoder_picks(n: int, density: float, run: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    carried = np.repeat(rng.random(n // run + 1) < density, run)[:n]
    segment = encode_segment(carried)
    assert segment[0] in (BITMAP, RICE, RICE_COMPLEMENT)
    positions, bits = decode_segment(segment, n, int(carried.sum()), "t")
    if bits is not None:
        assert np.array_equal(bits, carried)
    if positions is not None:
        assert np.array_equal(positions, np.flatnonzero(carried))


def test_segment_counts_must_agree() -> None:
    carried = np.zeros(100, dtype=bool)
    carried[[3, 50, 51]] = True
    segment = encode_segment(carried)
    with pytest.raises(Malformed):
        decode_segment(segment, 100, 4, "t")
    with pytest.raises(Malformed, match="unknown index coding"):
        decode_segment([7, 0, b"", b""], 100, 3, "t")
