"""Order-independent sums: an aggregate that is the same, bit for bit, whichever update arrived first.

Float addition is not associative, so folding updates into a running float64 sum in arrival order would make the
model depend on which agent answered first, and break bit-for-bit resume and every equivalence test. ``ExactSum``
keeps a sum of float64 terms *exactly*: each term is cut at fixed binary boundaries into 32-bit slices (an integer
times 2^(32k), found from the top slice down, every step exact in float64), and slice k of every term is added to
accumulator k, a float64 array of integers below 2^53 (exact for up to 2^21 terms). The accumulators are therefore
the same whatever the order; ``value()`` combines them, lowest slice first, into one float64 array, rounding the
same way every time. Only the slices a term occupies are touched; a model's values usually span three or four.

``WeightedSum`` folds named arrays with weights (a client's sample count, or 1): the sums of w_i * y_i per float
tensor, the integer tensors (BatchNorm's counters) for their element-wise lower median (``IntegerMedian``: one
device cannot move it, as it moved a maximum), and the total weight, so that
FedAvg's mean (sum n_i y_i) / (sum n_i) is known only when the round closes, as it must be. Pure numpy; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedge.protocol.robust_rules import lower_median

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


class IntegerMedian:
    """The integer tensors of a cohort's updates, kept until the round closes for their element-wise lower median.
    They are counters (BatchNorm's ``num_batches_tracked``): a few scalars per model, so keeping them costs nothing."""

    def __init__(self) -> None:
        self.values: dict[str, list[np.ndarray]] = {}

    def add(self, name: str, value: np.ndarray) -> None:
        self.values.setdefault(name, []).append(np.array(value))

    def __contains__(self, name: object) -> bool:
        return name in self.values

    def median(self, name: str) -> np.ndarray:
        return lower_median(self.values[name])

    def medians(self) -> dict[str, np.ndarray]:
        return {name: lower_median(values) for name, values in self.values.items()}


class WeightedSum:
    """Sums of w_i * y_i over named arrays, the total weight, and the lower median of integer arrays."""

    def __init__(self) -> None:
        self.sums: dict[str, ExactSum] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.integers = IntegerMedian()
        self.weight = 0.0
        self.count = 0

    def add(self, arrays: Mapping[str, np.ndarray], weight: float) -> None:
        self.count += 1
        self.weight += weight
        for name, array in arrays.items():
            array = np.asarray(array)
            if array.dtype.kind != "f":
                self.integers.add(name, array)
                continue
            total = self.sums.get(name)
            if total is None:
                total = self.sums[name] = ExactSum(array.size)
                self.shapes[name] = array.shape
            terms = array.astype(np.float64).ravel()  # a copy of its own ...
            terms *= weight
            total.add(terms, owned=True)               # ... used as the sum's scratch

    def total(self, name: str) -> np.ndarray:
        """sum_i w_i y_i of one float tensor, float64, in its shape."""
        return self.sums[name].value().reshape(self.shapes[name])


class FlatMean:
    """The weighted mean of flat vectors (each given at its positions), exactly summed: sum w_i v_i / sum w_i;
    vectors of weight 0 count, alike, only when none has a weight. Integer arrays beside them take their lower
    median."""

    def __init__(self, size: int) -> None:
        self.weighted, self.empty = ExactSum(size), ExactSum(size)
        self.weight, self.empties = 0.0, 0
        self.integers = IntegerMedian()

    def add(self, values: np.ndarray, at: np.ndarray | None, weight: float,
            integers: Mapping[str, np.ndarray] | None = None) -> None:
        if weight > 0:  # one pass: each value widened to float64, then multiplied (the same bits as in two)
            self.weighted.add(np.multiply(np.ravel(values), weight, dtype=np.float64), at, owned=True)
            self.weight += weight
        else:
            self.empty.add(np.array(values, dtype=np.float64).ravel(), at, owned=True)
            self.empties += 1
        for name, value in (integers or {}).items():
            self.integers.add(name, value)

    @property
    def count(self) -> int:
        return self.weighted.terms + self.empty.terms

    def mean(self) -> np.ndarray:
        if self.weight > 0:
            return self.weighted.value() / self.weight
        return self.empty.value() / max(self.empties, 1)
