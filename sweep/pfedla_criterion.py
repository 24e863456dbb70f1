"""The pre-registered pass criterion of pFedLA's chain reproduction, and the eta_hn rule (docs/algorithms.md section 6).

Pure numpy on alpha matrices: no torch, no other Fedge import, no I/O, so that tests/test_pfedla_criterion.py can
check the statistics on matrices whose answer is known; benchmarks/repro_pfedla.py applies them. ``alpha`` is (N, N): row i holds the weights client i's model is built
from, averaged over the aggregation layers; ``layers`` is (N, L, N), every layer's rows.

- Evaluation point: the first round whose mean self weight reaches 1.5 / N ("formed"); else the last ("not formed").
- C1 self-dominance: S(sigma) = mean_i alpha[i, sigma(i)]; p = #{sigma : S(sigma) >= S(id)} / N! over all N!
  permutations, p < 0.01; and self is its row's maximum in >= 6 of 8 rows (3/4 of the rows) and above its row's
  off-diagonal mean in every row.
- C2 overlap structure: Spearman rho(alpha_ij, |C_i & C_j|) over i != j >= 0.4; and D = mean alpha over pairs sharing
  the most classes (3 on the chain) - mean over pairs sharing none, D > 0, with p = #{pi : D(pi) >= D} / N! < 0.01,
  where pi relabels the clients (rows and columns of alpha together) against the fixed overlap matrix.
- C3 no collapse: no row is one-hot, neither a layer's row nor a layer-averaged one (the stricter of the two
  readings of "no row").

A permutation count includes the identity, so p >= 1 / N!; "S(sigma) >= S(id)" is read with a 1e-12 tolerance, so
exact ties count against the claim.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

P_LIMIT = 0.01
RHO_LIMIT = 0.4
FORMED_SELF_FACTOR = 1.5
TIE = 1e-12


@lru_cache(maxsize=4)
def permutations(n: int) -> np.ndarray:
    """All n! permutations of range(n), (n!, n), the identity first."""
    return np.array(list(itertools.permutations(range(n))), dtype=np.int64)


def overlap_matrix(class_sets: Sequence[Sequence[int]]) -> np.ndarray:
    """|C_i & C_j| for every pair of clients (the diagonal: each client's own class count)."""
    sets = [set(c) for c in class_sets]
    return np.array([[len(a & b) for b in sets] for a in sets], dtype=np.int64)


def evaluation_point(mean_self: Sequence[float], n: int) -> tuple[int, bool]:
    """(index into ``mean_self``, formed): the first round whose mean self weight reaches 1.5 / n, else the last."""
    threshold = FORMED_SELF_FACTOR / n
    for index, value in enumerate(mean_self):
        if value >= threshold:
            return index, True
    return len(mean_self) - 1, False


def mean_self_weight(alpha: np.ndarray) -> float:
    return float(np.mean(np.diag(alpha)))


def self_dominance(alpha: np.ndarray) -> dict[str, Any]:
    """C1 on a layer-averaged (N, N) matrix."""
    n = alpha.shape[0]
    perms = permutations(n)
    scores = alpha[np.arange(n), perms].mean(axis=1)
    observed = float(scores[0])
    p = float(np.count_nonzero(scores >= observed - TIE) / len(perms))
    off = alpha[~np.eye(n, dtype=bool)].reshape(n, n - 1)
    rows_max = int(sum(bool(np.all(alpha[i, i] > off[i])) for i in range(n)))
    rows_above = int(sum(bool(alpha[i, i] > off[i].mean()) for i in range(n)))
    passed = p < P_LIMIT and rows_max >= math.ceil(0.75 * n) and rows_above == n
    return {"S": observed, "p": p, "rows_self_max": rows_max, "rows_self_above_mean": rows_above, "passed": passed}


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    result = np.empty(len(values), dtype=np.float64)
    start = 0
    while start < len(values):
        stop = start
        while stop + 1 < len(values) and sorted_values[stop + 1] == sorted_values[start]:
            stop += 1
        result[order[start:stop + 1]] = (start + stop) / 2 + 1
        start = stop + 1
    return result


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho with average ranks for ties (Pearson's r of the ranks); nan when either side is constant."""
    rx, ry = ranks(np.asarray(x, np.float64)), ranks(np.asarray(y, np.float64))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / denominator if denominator > 0 else float("nan")


def overlap_structure(alpha: np.ndarray, overlap: np.ndarray) -> dict[str, Any]:
    """C2 on a layer-averaged (N, N) matrix against the true overlap matrix."""
    n = alpha.shape[0]
    off = ~np.eye(n, dtype=bool)
    rho = spearman(alpha[off], overlap[off])
    most = int(overlap[off].max())
    near_i, near_j = np.nonzero(off & (overlap == most))
    far_i, far_j = np.nonzero(off & (overlap == 0))
    perms = permutations(n)
    relabelled_near = alpha[perms[:, near_i], perms[:, near_j]].mean(axis=1)
    relabelled_far = alpha[perms[:, far_i], perms[:, far_j]].mean(axis=1)
    statistics = relabelled_near - relabelled_far
    observed = float(statistics[0])
    p = float(np.count_nonzero(statistics >= observed - TIE) / len(perms))
    passed = bool(rho >= RHO_LIMIT) and observed > 0 and p < P_LIMIT
    return {"rho": rho, "D": observed, "p": p, "most_shared": most, "passed": passed}


def relation_means(matrix: np.ndarray, overlap: np.ndarray) -> list[float]:
    """Mean alpha over pairs sharing 3, 2, 1 and 0 classes (off the diagonal), and the mean self weight (a
    description of the matrix; not a criterion)."""
    off = ~np.eye(matrix.shape[0], dtype=bool)
    return [float(matrix[off & (overlap == shared)].mean()) for shared in (3, 2, 1, 0)] + [
        mean_self_weight(matrix)]


def one_hot(row: np.ndarray) -> bool:
    return bool(np.count_nonzero(row) == 1)


def no_collapse(layers: np.ndarray) -> dict[str, Any]:
    """C3 on (N, L, N): counts the one-hot rows of every layer and of the layer average."""
    per_layer = int(sum(one_hot(row) for client in layers for row in client))
    averaged = int(sum(one_hot(row) for row in layers.mean(axis=1)))
    return {"one_hot_layer_rows": per_layer, "one_hot_mean_rows": averaged,
            "passed": per_layer == 0 and averaged == 0}


def strict_rows(alpha: np.ndarray) -> int:
    """The former strict reading, a description only: rows whose self weight is the row's maximum and whose chain
    neighbours (i - 1, i + 1 where they exist) both lie above the mean of the other clients."""
    n = alpha.shape[0]
    count = 0
    for i, row in enumerate(alpha):
        near = [j for j in (i - 1, i + 1) if 0 <= j < n]
        others = [j for j in range(n) if j != i and j not in near]
        self_max = all(row[i] > row[j] for j in range(n) if j != i)
        count += int(self_max and all(row[j] > row[others].mean() for j in near))
    return count


def judge(layers: np.ndarray, overlap: np.ndarray) -> dict[str, Any]:
    """C1-C3 on one evaluation point's (N, L, N) alpha; ``passed`` only when all three pass."""
    alpha = layers.mean(axis=1)
    c1, c2, c3 = self_dominance(alpha), overlap_structure(alpha, overlap), no_collapse(layers)
    return {"C1": c1, "C2": c2, "C3": c3, "strict_rows": strict_rows(alpha),
            "passed": bool(c1["passed"] and c2["passed"] and c3["passed"])}


def centred_norms(gradient: np.ndarray) -> np.ndarray:
    """||P g^l||_2 for every layer l of an (L, N) alpha-gradient: the norm of each row centred to mean 0."""
    centred = gradient - gradient.mean(axis=1, keepdims=True)
    return np.sqrt(np.sum(centred * centred, axis=1))


def eta_rule(gbar: float, gamma: float, rounds: int, drift: float = 0.1) -> float:
    """eta_hn = drift / (gamma * T * gbar): an alpha entry can drift about ``drift`` within T rounds."""
    if gbar <= 0 or gamma <= 0 or rounds < 1:
        raise ValueError(f"the eta_hn rule needs gbar > 0, gamma > 0 and T >= 1 (got {gbar}, {gamma}, {rounds})")
    return drift / (gamma * rounds * gbar)
