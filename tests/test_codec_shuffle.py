"""Byte shuffling of value blocks: the word-shift fast paths give the same bytes as the plain plane copy."""

from __future__ import annotations

import numpy as np
import pytest

from codec import values
from codec.values import Shuffled, shuffle, unshuffle


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
