"""Byte shuffling of value blocks: the word-shift fast paths give the same bytes as the plain plane copy."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.codec import values
from fedge.codec.values import Shuffled, shuffle, unshuffle


@pytest.mark.parametrize("dtype", ["<f4", "<f2", "<u2"])
@pytest.mark.parametrize("count", [0, 1, 7, values.SHIFT_BLOCK + 123])
def test_write_into_and_unshuffle_match_the_plain_plane_layout(dtype: str, count: int) -> None:
    rng = np.random.default_rng(count)
    raw = rng.integers(0, 256, count * np.dtype(dtype).itemsize, dtype=np.uint8)
    rows = raw.reshape(count, np.dtype(dtype).itemsize)
    expected = shuffle(rows).tobytes()  # plane j = byte j of every value, the spec's layout
    for j in range(rows.shape[1]):
        assert expected[j * count:(j + 1) * count] == rows[:, j].tobytes()
    out = np.full(raw.size, 0xAA, dtype=np.uint8)
    Shuffled(rows).write_into(out)
    assert out.tobytes() == expected
    assert np.array_equal(unshuffle(expected, count, rows.shape[1]), rows)


def test_a_strided_block_takes_the_plain_path() -> None:
    wide = np.arange(40, dtype=np.uint8).reshape(10, 4)[:, :2]  # not contiguous
    out = np.empty(20, dtype=np.uint8)
    Shuffled(wide).write_into(out)
    assert out.tobytes() == shuffle(np.ascontiguousarray(wide)).tobytes()


@pytest.mark.parametrize("count", [0, 1, 7, values.SHIFT_BLOCK + 123])
def test_rotated_f32_planes_hold_exponents_signs_and_mantissa_as_the_spec_says(count: int) -> None:
    rng = np.random.default_rng(count + 1)
    bits = rng.integers(0, 2**32, count, dtype=np.uint64).astype("<u4")
    rows = bits.view(np.uint8).reshape(count, 4)
    out = np.full(4 * count, 0xAA, dtype=np.uint8)
    Shuffled(rows, rotate=True).write_into(out)
    planes = out.reshape(4, count).astype(np.uint32)
    assert np.array_equal(planes[3], (bits >> 23) & 0xFF)  # the biased exponent
    assert np.array_equal(planes[2], (bits >> 15) & 0xFF)  # the top 8 mantissa bits
    assert np.array_equal(planes[1], (bits >> 7) & 0xFF)
    assert np.array_equal(planes[0], ((bits & 0x7F) << 1) | (bits >> 31))  # low 7 mantissa bits, then the sign
    assert out.tobytes() == Shuffled(rows, rotate=True).tobytes()
    assert np.array_equal(unshuffle(out.tobytes(), count, 4, rotate=True), rows)


def test_f32_value_blocks_round_trip_every_bit_pattern_through_the_rotation() -> None:
    special = np.array([0.0, -0.0, np.inf, -np.inf, 1.5, -0.25, 1e-45, -3.4e38], np.float32)
    nan_payloads = np.array([0x7FC00001, 0xFFBFFFFF, 0x7F800001], np.uint32).view(np.float32)
    block = np.concatenate([special, nan_payloads])
    payload, _ = values.encode_values(block, "f32", [block.size])
    assert isinstance(payload, Shuffled) and payload.rotate
    back = values.decode_values(payload.tobytes(), b"", "f32", [block.size], allow_nonfinite=True, where="t")
    assert back.view(np.uint32).tolist() == block.view(np.uint32).tolist()


def test_the_kept_shift_scratch_stays_bounded_after_large_blocks() -> None:
    """The per-thread scratch is kept between packets, so it must not grow with the block (a 1-2 GB board)."""
    count = 3 * values.SHIFT_BLOCK + 5
    rows = np.arange(count, dtype="<u4").view(np.uint8).reshape(count, 4)
    out = np.empty(4 * count, dtype=np.uint8)
    Shuffled(rows, rotate=True).write_into(out)
    assert np.array_equal(unshuffle(out.tobytes(), count, 4, rotate=True), rows)
    kept = [getattr(values._local, name) for name in ("words2", "words4") if hasattr(values._local, name)]
    assert kept and all(scratch.size <= values.SHIFT_BLOCK for scratch in kept)
