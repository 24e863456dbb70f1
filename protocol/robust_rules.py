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

Each rule reads the n changes of d values (float32 is enough) block by block of coordinates, in float64, so that
it needs little memory beyond the changes themselves. Pure numpy: no torch, no I/O. The
ties are broken by row order, which the caller makes the client order.
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


# Coordinates per block of the coordinate-wise work: a block's temporaries are n x BLOCK values, so a rule over a
# cohort of n changes of d values needs the changes themselves and little more (docs/robustness.md, "What it costs").
BLOCK = 1 << 16


class Rows:
    """n changes of d values each, as an n x d matrix or as n vectors (never stacked whole), read block by block
    of coordinates in float64."""

    def __init__(self, rows: np.ndarray | Sequence[np.ndarray]) -> None:
        self.rows = rows
        self.n = len(rows)
        self.d = int(np.asarray(rows[0]).size) if self.n else 0
        if any(np.asarray(row).size != self.d for row in rows):
            raise ValueError("the changes a robust rule combines must all have one length")

    def blocks(self) -> list[slice]:
        return [slice(at, min(at + BLOCK, self.d)) for at in range(0, self.d, BLOCK)]

    def block(self, part: slice, chosen: Sequence[int] | None = None) -> np.ndarray:
        """Coordinates ``part`` of the chosen rows (default: all), a new float64 array."""
        indices = range(self.n) if chosen is None else chosen
        return np.stack([np.asarray(self.rows[i][part], dtype=np.float64) for i in indices]) if len(indices) \
            else np.zeros((0, part.stop - part.start))


def row_norms(changes: Rows, centre: np.ndarray | None = None) -> np.ndarray:
    """The L2 norm of each row (of each row minus ``centre``)."""
    squares = np.zeros(changes.n)
    for part in changes.blocks():
        rows = changes.block(part)
        if centre is not None:
            rows -= centre[part]
        squares += np.einsum("ij,ij->i", rows, rows)
    return np.sqrt(squares)


def krum_selection(changes: Rows | np.ndarray, byzantine: int) -> list[int]:
    """The rows Multi-Krum averages: the n - f of lowest score (neighbours: n - f - 2, at least 1)."""
    changes = changes if isinstance(changes, Rows) else Rows(changes)
    n = changes.n
    if n <= 2:
        return list(range(n))
    gram = np.zeros((n, n))
    for part in changes.blocks():
        rows = changes.block(part)
        gram += rows @ rows.T
    squares = np.diag(gram)
    distances = np.maximum(squares[:, None] + squares[None, :] - 2.0 * gram, 0.0)
    neighbours = max(1, n - byzantine - 2)
    scores = []
    for i in range(n):
        others = np.sort(np.delete(distances[i], i), kind="stable")
        scores.append(float(np.sum(others[:neighbours])))
    keep = max(1, n - byzantine)
    return sorted(np.argsort(np.asarray(scores), kind="stable")[:keep].tolist())


def mean_of(changes: Rows, chosen: Sequence[int] | None = None, weights: np.ndarray | None = None) -> np.ndarray:
    """The mean of the chosen rows (each times its weight, when given), in float64."""
    out = np.empty(changes.d)
    for part in changes.blocks():
        block = changes.block(part, chosen)
        if weights is not None:
            block *= weights[:, None]
        out[part] = block.mean(axis=0)
    return out


def centered_clip(changes: Rows, tau_factor: float, iterations: int) -> np.ndarray:
    tau = tau_factor * float(np.median(row_norms(changes)))
    v = np.zeros(changes.d)
    for _ in range(max(1, iterations)):
        lengths = row_norms(changes, v)
        scales = np.where(lengths > tau, tau / np.maximum(lengths, 1e-300), 1.0)
        # v + mean_i (x_i - v) s_i = v (1 - mean_i s_i) + mean_i s_i x_i
        v = v * (1.0 - float(scales.mean())) + mean_of(changes, weights=scales)
    return v


def coordinatewise(changes: Rows, rule: RobustRule) -> np.ndarray:
    k = trimmed_count(rule, changes.n)
    out = np.empty(changes.d)
    for part in changes.blocks():
        block = changes.block(part)
        if rule.aggregator == "median":
            out[part] = np.median(block, axis=0)
        else:
            block.sort(axis=0, kind="stable")
            out[part] = block[k:changes.n - k].mean(axis=0)
    return out


def combine(rule: RobustRule, rows: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """One change (float64) from the rows (n vectors of one length, or an n x d matrix), by ``rule``; they are
    read block by block, never copied whole."""
    changes = Rows(rows)
    if rule.aggregator == "mean":
        return mean_of(changes)
    if rule.aggregator in ("median", "trimmed-mean"):
        return coordinatewise(changes, rule)
    if rule.aggregator == "multi-krum":
        return mean_of(changes, krum_selection(changes, rule.byzantine))
    if rule.aggregator == "centered-clip":
        return centered_clip(changes, rule.cc_tau, rule.cc_iters)
    raise ValueError(f"unknown robust aggregator {rule.aggregator!r}: {', '.join(AGGREGATORS)}")
