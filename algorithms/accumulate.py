"""Weighted sums of named arrays for the algorithms' streaming folds, exact and so order-independent (each float
tensor's sum is a ``protocol.exact_sum.ExactSum``).

``WeightedSum`` folds named arrays with weights (a client's sample count, or 1): the sums of w_i * y_i per float
tensor, the integer tensors (BatchNorm's counters) for their element-wise lower median (``IntegerMedian``: one
device cannot move it, as it moved a maximum), and the total weight (exactly rounded, so also order-independent), so
that FedAvg's mean (sum n_i y_i) / (sum n_i) is known only when the round closes, as it must be. Pure numpy; no
torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fedge.protocol.exact_sum import ExactSum
from fedge.protocol.robust_rules import lower_median


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
    """Sums of w_i * y_i over named arrays, the total weight, and the lower median of integer arrays. An add's
    ``counted`` is what it adds to the total weight when that differs from ``weight`` (an asynchronous session's
    stale update: ``protocol.asynchronous``)."""

    def __init__(self) -> None:
        self.sums: dict[str, ExactSum] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.integers = IntegerMedian()
        self.weights: list[float] = []
        self.count = 0

    @property
    def weight(self) -> float:
        """The total weight, exactly rounded (the same whatever order the adds came in)."""
        return math.fsum(self.weights)

    def add(self, arrays: Mapping[str, np.ndarray], weight: float, counted: float | None = None) -> None:
        self.count += 1
        self.weights.append(weight if counted is None else counted)
        for name, array in arrays.items():
            array = np.asarray(array)
            if array.dtype.kind != "f":
                self.integers.add(name, array)
                continue
            total = self.sums.get(name)
            if total is None:
                total = self.sums[name] = ExactSum(array.size)
                self.shapes[name] = array.shape
            # one pass: each value widened to float64, then multiplied (the same bits as in two), into a copy of
            # its own that the sum uses as scratch
            total.add(np.multiply(array.ravel(), weight, dtype=np.float64), owned=True)

    def total(self, name: str) -> np.ndarray:
        """sum_i w_i y_i of one float tensor, float64, in its shape."""
        return self.sums[name].value().reshape(self.shapes[name])


class FlatMean:
    """The weighted mean of flat vectors (each given at its positions), exactly summed: sum w_i d_i v_i / sum w_i c_i
    (``d_i``, ``c_i``: an asynchronous session's staleness factors, ``ClientUpdate.discount`` and ``counted``; 1 in
    rounds); vectors of weight 0 count, alike, only when none has a weight. Integer arrays beside them take their
    lower median."""

    def __init__(self, size: int) -> None:
        self.weighted, self.empty = ExactSum(size), ExactSum(size)
        self.divisors: list[float] = []
        self.empties = 0
        self.integers = IntegerMedian()

    @property
    def weight(self) -> float:
        """The divisor, exactly rounded (so independent of the order of the updates)."""
        return math.fsum(self.divisors)

    def add(self, values: np.ndarray, at: np.ndarray | None, weight: float,
            integers: Mapping[str, np.ndarray] | None = None, discount: float = 1.0, counted: float = 1.0) -> None:
        if weight > 0:  # one pass: each value widened to float64, then multiplied (the same bits as in two)
            self.weighted.add(np.multiply(np.ravel(values), weight * discount, dtype=np.float64), at, owned=True)
            self.divisors.append(weight * counted)
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
