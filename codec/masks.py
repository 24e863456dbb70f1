"""Mask helpers shared by the codec CLI, DSSA and the error-feedback modes.

`retained_count` turns a sparsity or keep fraction into an exact count (decimal text, never binary
floating point), `topk_mask` builds the global magnitude mask of docs/algorithms.md section 4.3, and
`mask_crc` is the checksum that binds a values-only uplink to the mask it was encoded against.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from fedge.codec.errors import NonFinite

BoolArray = npt.NDArray[np.bool_]


def _exact_fraction(value: float | str, what: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Fraction)):
        raise ValueError(f"{what} must be a number or its decimal text, got {value!r}")
    try:
        frac = Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{what} {value!r} is not a decimal number") from None
    if not 0 <= frac <= 1:
        raise ValueError(f"{what} must lie in [0, 1], got {value!r}")
    return frac


def retained_count(n: int, *, sparsity: float | str | None = None, keep: float | str | None = None) -> int:
    """Number of coordinates kept out of `n`: k = n - floor(p * n), computed exactly.

    Give exactly one of `sparsity` (p, the fraction pruned) or `keep` (q, the fraction kept; then
    p = 1 - q). Both are read from their decimal text with `Fraction(str(x))`, so
    `retained_count(10, keep=0.2) == retained_count(10, sparsity=0.8) == 2`.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if (sparsity is None) == (keep is None):
        raise ValueError("give exactly one of sparsity= or keep=")
    if sparsity is not None:
        p = _exact_fraction(sparsity, "sparsity")
    else:
        assert keep is not None
        p = 1 - _exact_fraction(keep, "keep")
    return n - math.floor(p * n)


def _flat_magnitudes(arrays: Sequence[npt.ArrayLike]) -> npt.NDArray[np.floating]:
    parts = [np.asarray(a) for a in arrays]
    for part in parts:
        if part.dtype.kind not in "fiub":
            raise ValueError(f"topk_mask needs real numeric arrays, got dtype {part.dtype}")
    if not parts:
        return np.zeros(0, np.float32)
    flat = np.concatenate([p.reshape(-1) for p in parts])
    if flat.dtype.kind != "f":
        flat = flat.astype(np.float64)
    magnitudes: npt.NDArray[np.floating] = np.abs(flat)
    return magnitudes


def topk_mask(arrays: Sequence[npt.ArrayLike], k: int) -> BoolArray:
    """Bool mask over the row-major concatenation of `arrays`, True on the k largest |value|.

    Ties are broken by the smaller flat index, exactly as a stable sort by (-|w|, index) would.
    Runs in linear time: a partition finds the k-th largest magnitude, then only the ties at that
    threshold are resolved by index. NaN values are rejected with `NonFinite`.
    """
    mag = _flat_magnitudes(arrays)
    n = mag.size
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= n:
        raise ValueError(f"k must be an int in [0, {n}], got {k!r}")
    if np.isnan(mag).any():
        raise NonFinite("topk_mask: the weights contain NaN; a magnitude order is undefined")
    if k == n:
        return np.ones(n, dtype=np.bool_)
    if k == 0:
        return np.zeros(n, dtype=np.bool_)
    threshold = np.partition(mag, n - k)[n - k]
    mask: BoolArray = np.greater(mag, threshold)
    missing = int(k) - int(np.count_nonzero(mask))
    ties = np.flatnonzero(mag == threshold)[:missing]
    mask[ties] = True
    return mask


def flat_positions(mask: BoolArray) -> npt.NDArray[np.int64]:
    """`np.flatnonzero(mask)` for a 1-D bool array, about twice as fast at 3-10 % density.

    numpy (2.x) switches to a branchy loop at or below 10 % density, which is slowest around
    5 %; appending a run of True values lifts the density over 10 % and keeps the fast
    branch-free loop. The answer is identical either way.
    """
    n = mask.size
    k = int(np.count_nonzero(mask))
    if not (n // 33 <= k <= n // 10) or n < 4096:
        return np.flatnonzero(mask)
    padded = np.ones(n + (n - 10 * k) // 9 + 1, dtype=np.bool_)
    padded[:n] = mask
    return np.flatnonzero(padded)[:k]


def mask_crc(mask: npt.ArrayLike) -> int:
    """CRC-32 (zlib polynomial) of `np.packbits(mask)`.

    Bits are packed eight to a byte, the first mask element in the most significant bit
    (`np.packbits`' big-endian bit order), and the last byte is padded with zero bits.
    """
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        raise ValueError(f"mask must be a bool array, got dtype {arr.dtype}")
    return zlib.crc32(np.packbits(arr.reshape(-1)).tobytes()) & 0xFFFFFFFF
