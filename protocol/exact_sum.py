"""Order-independent exact sums: an aggregate that is the same, bit for bit, whichever term arrived first.

Float addition is not associative, so folding updates into a running float64 sum in arrival order would make the
model depend on which agent answered first, and break bit-for-bit resume and every equivalence test. ``ExactSum``
keeps a sum of float64 terms *exactly*: each term is cut at fixed binary boundaries into 32-bit slices (an integer
times 2^(32k), found from the top slice down, every step exact in float64), and slice k of every term is added to
accumulator k, a float64 array of integers below 2^53 (exact for up to 2^21 terms). The accumulators are therefore
the same whatever the order; ``value()`` combines them, lowest slice first, into one float64 array, rounding the
same way every time. Only the slices a term occupies are touched; a model's values usually span three or four.
Pure numpy: the algorithms' weighted sums (``algorithms.accumulate``) and the private sum (``protocol.privacy``)
build on it; it knows no update, payload or model.
"""

from __future__ import annotations

import numpy as np

SLICE_BITS = 32
MAX_TERMS = 1 << 21  # accumulators hold integers below 2^53: 2^21 terms of at most 32 bits each


class ExactSum:
    """The exact sum of float64 arrays of one shape (optionally added at flat positions)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.slices: dict[int, np.ndarray] = {}
        self.terms = 0

    def add(self, terms: np.ndarray, at: np.ndarray | None = None, *, owned: bool = False) -> None:
        """Add ``terms`` (flat float64; at the flat positions ``at``, which must not repeat, when given).
        ``owned``: the caller hands over ``terms`` (it is used as scratch, saving a copy)."""
        if self.terms >= MAX_TERMS:
            raise OverflowError(f"an exact sum holds at most {MAX_TERMS} terms")
        self.terms += 1
        rest = np.asarray(terms, dtype=np.float64).ravel()
        if not owned or rest is terms and not rest.flags.writeable:
            rest = rest.copy()
        piece = np.empty_like(rest)
        largest = max(float(rest.max()), -float(rest.min())) if rest.size else 0.0  # max |term|, NaN if any
        if not np.isfinite(largest):
            raise ValueError("an exact sum takes finite values only")
        if largest == 0.0:
            return
        k = -(-(int(np.frexp(largest)[1]) - SLICE_BITS) // SLICE_BITS)  # the top slice: ceil((e_max - 32) / 32)
        while True:  # from the top slice down, until nothing is left (every step exact in float64)
            np.ldexp(rest, -SLICE_BITS * k, out=piece)
            np.trunc(piece, out=piece)
            accumulator = self.slices.get(k)
            if accumulator is None:
                accumulator = self.slices[k] = np.zeros(self.size, dtype=np.float64)
            if at is None:
                accumulator += piece
            else:
                np.add.at(accumulator, at, piece)  # positions never repeat: the same bits as a[at] += piece, half the time
            np.ldexp(piece, SLICE_BITS * k, out=piece)
            rest -= piece
            left = np.count_nonzero(rest)
            if not left:
                return
            if left < rest.size // 4:  # the lower slices hold few terms: carry on with those alone
                keep = np.flatnonzero(rest)
                rest, at = rest[keep], keep if at is None else at[keep]
                piece = np.empty_like(rest)
            k -= 1

    def value(self) -> np.ndarray:
        """The sum as float64, combined in one fixed order (the same bits for the same terms in any order)."""
        total = np.zeros(self.size, dtype=np.float64)
        for k in sorted(self.slices):
            total += np.ldexp(self.slices[k], SLICE_BITS * k)
        return total
