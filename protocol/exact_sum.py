"""Order-independent exact sums: an aggregate that is the same, bit for bit, whichever term arrived first.

Float addition is not associative, so folding updates into a running float64 sum in arrival order would make the
model depend on which agent answered first, and break bit-for-bit resume and every equivalence test. ``ExactSum``
keeps a sum of float64 terms *exactly*: each term is cut at fixed binary boundaries into 32-bit slices (an integer
times 2^(32k), found from the top slice down, every step exact in float64), and slice k of every term is added to
accumulator k, a float64 array of integers below 2^53 (exact for up to 2^21 terms). The accumulators are therefore
the same whatever the order; ``value()`` combines them, lowest slice first, into one float64 array, rounding the
same way every time. Only the slices a term occupies are touched; a model's values usually span three or four.
A large add may be cut into parts of positions, which a driver folds on a few threads (numpy lets go of the
interpreter lock; ``fold_in_parts``): each position's slices are the same however the terms are cut, so the sum is. Pure numpy: the algorithms' weighted sums (``algorithms.accumulate``) and the private sum (``protocol.privacy``)
build on it; it knows no update, payload or model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

SLICE_BITS = 32
MAX_TERMS = 1 << 21  # accumulators hold integers below 2^53: 2^21 terms of at most 32 bits each
SLICE_UNIT = 2.0 ** SLICE_BITS
MAX_NORMAL_EXPONENT = 1023  # 2.0 ** e is a float64 up to here; ldexp beyond
PART_TERMS = 1 << 18  # an add of at least twice this many terms may be cut into parts (``fold_in_parts``)

Part = Callable[[], None]
PartRunner = Callable[[Sequence[Part]], None]


def in_turn(parts: Sequence[Part]) -> None:
    for part in parts:
        part()


_parts: tuple[int, PartRunner] = (1, in_turn)


def fold_in_parts(count: int, run: PartRunner) -> None:
    """Let a large add be cut into up to ``count`` parts of positions, handed to ``run``, which must return only once
    every part has finished and raise what any raised. A driver that may use threads installs them
    (``plumbing.threads.part_threads``); this module has none, and without a driver an add is one part."""
    global _parts
    _parts = (max(1, count), run)


def parts_for(size: int) -> int:
    return max(1, min(_parts[0], size // PART_TERMS))


def still_to_cut(rest: np.ndarray, at: np.ndarray | None, base: int) -> tuple[np.ndarray, np.ndarray | None] | None:
    """What is left of the terms once a slice is cut from them: None when nothing is; the terms and their positions
    as they are, or, when few are nonzero (the lower slices usually hold few), those alone at their positions."""
    left = np.count_nonzero(rest)
    if not left:
        return None
    if left >= rest.size // 4:
        return rest, at
    keep = np.flatnonzero(rest)
    return rest[keep], keep + base if at is None else at[keep]


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
        rest = np.asarray(terms, dtype=np.float64).ravel()
        if not owned or rest is terms and not rest.flags.writeable:
            rest = rest.copy()
        largest = max(float(rest.max()), -float(rest.min())) if rest.size else 0.0  # max |term|, NaN if any
        if not np.isfinite(largest):
            raise ValueError("an exact sum takes finite values only")
        self.terms += 1
        if largest == 0.0:
            return
        k = -(-(int(np.frexp(largest)[1]) - SLICE_BITS) // SLICE_BITS)  # the top slice: ceil((e_max - 32) / 32)
        count = parts_for(rest.size)
        if count == 1:
            self.add_span(rest, at, 0, k)
            return
        bounds = [rest.size * i // count for i in range(count + 1)]
        _parts[1]([partial(self.add_span, rest[lo:hi], None if at is None else at[lo:hi], lo, k)
                   for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)])

    def add_span(self, rest: np.ndarray, at: np.ndarray | None, base: int, k: int) -> None:
        """Terms ``rest`` (scratch) at ``at``, or at positions base, base + 1, ... when ``at`` is None; ``k``: the
        top slice."""
        if k > 0:  # terms of 2^32 or more: scaling them down could round the smallest, so cut them as they are
            self.add_from_top(rest, at, base, k)
            return
        # In units of slice k: every term times 2^(-32k), exact (a scale up, all below 2^32); then, slice by slice,
        # the whole units go to accumulator k and the fraction left, times 2^32, is the next slice's units.
        if SLICE_BITS * -k <= MAX_NORMAL_EXPONENT:
            rest *= 2.0 ** (SLICE_BITS * -k)
        else:
            np.ldexp(rest, SLICE_BITS * -k, out=rest)
        whole = np.empty_like(rest)
        while True:
            np.trunc(rest, out=whole)
            self.accumulate(k, whole, at, base)
            rest -= whole
            left = still_to_cut(rest, at, base)
            if left is None:
                return
            if left[0] is not rest:
                rest, at = left
                whole = np.empty_like(rest)
            rest *= SLICE_UNIT
            k -= 1

    def add_from_top(self, rest: np.ndarray, at: np.ndarray | None, base: int, k: int) -> None:
        """``add_span`` for terms of 2^32 or more: each slice cut from the terms in their own units."""
        piece = np.empty_like(rest)
        while True:
            np.ldexp(rest, -SLICE_BITS * k, out=piece)
            np.trunc(piece, out=piece)
            self.accumulate(k, piece, at, base)
            np.ldexp(piece, SLICE_BITS * k, out=piece)
            rest -= piece
            left = still_to_cut(rest, at, base)
            if left is None:
                return
            if left[0] is not rest:
                rest, at = left
                piece = np.empty_like(rest)
            k -= 1

    def accumulate(self, k: int, whole: np.ndarray, at: np.ndarray | None, base: int) -> None:
        """Add slice k's whole units (integers below 2^32 in magnitude) to its accumulator, at ``at`` or from
        ``base`` on."""
        accumulator = self.slices.get(k)
        if accumulator is None:  # setdefault is one step: parts that reach a new slice together share one
            accumulator = self.slices.setdefault(k, np.zeros(self.size, dtype=np.float64))
        if at is None:
            accumulator[base:base + whole.size] += whole
        else:
            np.add.at(accumulator, at, whole)  # positions never repeat: the same bits as a[at] += whole, half the time

    def value(self) -> np.ndarray:
        """The sum as float64, combined in one fixed order (the same bits for the same terms in any order)."""
        total = np.zeros(self.size, dtype=np.float64)
        for k in sorted(self.slices):
            total += np.ldexp(self.slices[k], SLICE_BITS * k)
        return total
