"""The field secure aggregation sums in: integers modulo 2^bits, how real values are put on it and taken back.

A device quantises each coordinate of its change to an integer in [-L, L] on a grid the coordinator publishes for
the round (``clip``: the value that maps to L, per coordinate), with unbiased stochastic rounding (the expected
integer is exactly the scaled value; L is at most 2^52, where float64 still rounds exactly), and lifts it into the
field. The sum of n devices' integers lies in [-nL, nL]; with n(2L + 1) <= 2^bits (``levels_for``) it is read back
from the field sum without ambiguity (``signed``). Words are uint64 (every modulus 2^bits divides 2^64, so uint64
wrap-around is the field's addition); on the wire they travel as unsigned integers of 8, 16, 32 or 64 bits
(``protocol.secure_device.masked_group``). Pure numpy; nothing of Fedge, no I/O.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
MIN_BITS, MAX_BITS = 8, 62
MAX_LEVELS = 1 << 52  # a wider field adds headroom, not levels


def check_bits(bits: int) -> None:
    if not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"secagg.bits = {bits}: it must lie in [{MIN_BITS}, {MAX_BITS}]")


def modulus_mask(bits: int) -> np.uint64:
    return np.uint64((1 << bits) - 1)


def levels_for(bits: int, devices: int, headroom: float = 1.0) -> int:
    """L, the largest level count with ``devices`` * (2L + 1) * ``headroom`` <= 2^bits: the sum of every selected
    device's integers (and, with ``headroom`` > 1, room for noise) never wraps."""
    check_bits(bits)
    if devices < 1 or headroom < 1.0:
        raise ValueError("levels_for needs at least one device and a headroom of at least 1")
    levels = (math.floor(Fraction(1 << bits) / (devices * Fraction(headroom))) - 1) // 2  # exact above 2^53
    levels = min(levels, MAX_LEVELS)  # stochastic rounding in float64 stays exact below 2^52
    if levels < 1:
        raise ValueError(f"{bits} bits cannot hold the sum of {devices} devices' values: raise secagg.bits")
    return levels


def quantise(values: npt.NDArray[np.floating], clip: npt.NDArray[np.floating] | float, levels: int,
             rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Each value clipped to [-clip, clip], scaled to [-L, L] and rounded down or up at random so that its
    expected integer is the scaled value."""
    bound = np.asarray(clip, dtype=np.float64)
    if np.any(bound <= 0) or not np.all(np.isfinite(bound)):
        raise ValueError("the quantisation grid's clip must be positive and finite")
    if not 1 <= levels <= MAX_LEVELS:
        raise ValueError(f"{levels} levels: at most 2^52 (float64 rounds exactly only below)")
    values = np.asarray(values, np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError("a change with a NaN or infinite value cannot be quantised")
    scaled = np.clip(values, -bound, bound) / bound * levels
    low = np.floor(scaled)
    up = rng.random(scaled.shape) < (scaled - low)
    rounded: npt.NDArray[np.int64] = np.clip((low + up).astype(np.int64), -levels, levels)  # integer bounds
    return rounded


def dequantise(integers: npt.NDArray[np.int64], clip: npt.NDArray[np.floating] | float, levels: int
               ) -> npt.NDArray[np.float64]:
    return np.asarray(integers, np.float64) * (np.asarray(clip, np.float64) / levels)


def lift(integers: npt.NDArray[np.int64], bits: int) -> U64:
    """Signed integers as field words (two's complement, reduced modulo 2^bits)."""
    return integers.astype(np.int64).view(np.uint64) & modulus_mask(bits)


def signed(words: U64, bits: int) -> npt.NDArray[np.int64]:
    """Field words read back as integers in [-2^(bits-1), 2^(bits-1))."""
    words = np.asarray(words, np.uint64) & modulus_mask(bits)
    out = words.astype(np.int64)
    return np.where(words >= np.uint64(1 << (bits - 1)), out - (1 << bits), out)


def add(a: U64, b: U64, bits: int) -> U64:
    return (a + b) & modulus_mask(bits)


def subtract(a: U64, b: U64, bits: int) -> U64:
    return (a - b) & modulus_mask(bits)
