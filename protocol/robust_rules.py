"""Robust aggregation rules: the combination of a cohort's update changes that no minority of them can steer, in
place of the (weighted) mean. Each rule takes the changes of one update group as rows of a matrix and returns one
change; all are unweighted (a claimed sample count buys nothing).

- ``trimmed-mean``: per coordinate, the mean after dropping the ``k`` largest and ``k`` smallest values, ``k`` =
  ``byzantine`` when set, else floor(``trim`` * n) (at most (n - 1) // 2).
- ``median``: per coordinate, the median.
- ``multi-krum`` (Blanchard et al. 2017): each change's score is the sum of squared distances to its n - f - 2
  nearest others (f = ``byzantine``); the n - f changes of lowest score are averaged, uniformly.
- ``centered-clip`` (Karimireddy et al. 2021): from v = 0 (no change), ``cc_iters`` times
  v <- v + mean_i (x_i - v) * min(1, tau / |x_i - v|), tau = ``cc_tau`` times the median change norm of the cohort.

Pure numpy: no torch, no I/O. The ties are broken by row order, which the caller makes the client order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

AGGREGATORS = ("mean", "trimmed-mean", "median", "multi-krum", "centered-clip")


@dataclass(frozen=True)
class RobustRule:
    """``[robust]``'s aggregation settings."""

    aggregator: str = "mean"
    trim: float = 0.1
    byzantine: int = 0
    cc_tau: float = 1.0
    cc_iters: int = 3

    @property
    def robust(self) -> bool:
        return self.aggregator != "mean"


def lower_median(arrays: list[np.ndarray]) -> np.ndarray:
    """The element-wise lower median of integer arrays of one shape (the middle value, the lower of the two middle
    ones for an even count): one of the values given, whatever their order."""
    stacked = np.sort(np.stack(arrays), axis=0, kind="stable")
    return np.asarray(stacked[(len(arrays) - 1) // 2])


def trimmed_count(rule: RobustRule, n: int) -> int:
    k = rule.byzantine if rule.byzantine > 0 else int(np.floor(rule.trim * n))
    return max(0, min(k, (n - 1) // 2))


def krum_selection(changes: np.ndarray, byzantine: int) -> list[int]:
    """The rows Multi-Krum averages: the n - f of lowest score (neighbours: n - f - 2, at least 1)."""
    n = changes.shape[0]
    if n <= 2:
        return list(range(n))
    squares = np.sum(changes * changes, axis=1)
    distances = np.maximum(squares[:, None] + squares[None, :] - 2.0 * changes @ changes.T, 0.0)
    neighbours = max(1, n - byzantine - 2)
    scores = []
    for i in range(n):
        others = np.sort(np.delete(distances[i], i), kind="stable")
        scores.append(float(np.sum(others[:neighbours])))
    keep = max(1, n - byzantine)
    return sorted(np.argsort(np.asarray(scores), kind="stable")[:keep].tolist())


def centered_clip(changes: np.ndarray, tau_factor: float, iterations: int) -> np.ndarray:
    norms = np.linalg.norm(changes, axis=1)
    tau = tau_factor * float(np.median(norms))
    v = np.zeros(changes.shape[1])
    for _ in range(max(1, iterations)):
        offsets = changes - v
        lengths = np.linalg.norm(offsets, axis=1)
        scales = np.where(lengths > tau, tau / np.maximum(lengths, 1e-300), 1.0)
        v = v + np.mean(offsets * scales[:, None], axis=0)
    return v


def combine(rule: RobustRule, rows: Sequence[np.ndarray]) -> np.ndarray:
    """One change from the rows (float64 vectors of one length), by ``rule``."""
    changes = np.stack([np.asarray(r, dtype=np.float64) for r in rows])
    n = changes.shape[0]
    if rule.aggregator == "mean":
        return np.asarray(changes.mean(axis=0))
    if rule.aggregator == "median":
        return np.asarray(np.median(changes, axis=0))
    if rule.aggregator == "trimmed-mean":
        k = trimmed_count(rule, n)
        ordered = np.sort(changes, axis=0, kind="stable")
        return np.asarray(ordered[k:n - k].mean(axis=0))
    if rule.aggregator == "multi-krum":
        return np.asarray(changes[krum_selection(changes, rule.byzantine)].mean(axis=0))
    if rule.aggregator == "centered-clip":
        return centered_clip(changes, rule.cc_tau, rule.cc_iters)
    raise ValueError(f"unknown robust aggregator {rule.aggregator!r}: {', '.join(AGGREGATORS)}")
