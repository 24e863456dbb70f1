"""The chain reproduction's pre-registered statistics (fedge.sweep.pfedla_criterion) on matrices whose answer is
known: a strong diagonal passes C1 and a shuffled one fails; a matrix built from the overlap passes C2 and the same
matrix with its clients relabelled fails; one-hot rows fail C3; the eta_hn rule's arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedge.sweep import pfedla_criterion as criterion

CHAIN = [[(i + k) % 10 for k in range(4)] for i in range(8)]
OVERLAP = criterion.overlap_matrix(CHAIN)


def rows(matrix: np.ndarray) -> np.ndarray:
    return matrix / matrix.sum(axis=1, keepdims=True)


def noise(seed: int, scale: float = 0.004) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-scale, scale, size=(8, 8))


def test_the_chain_overlap_matrix() -> None:
    assert OVERLAP[0].tolist() == [4, 3, 2, 1, 0, 0, 0, 1]  # client 7 = {7, 8, 9, 0} shares class 0 with client 0
    assert OVERLAP[3].tolist() == [1, 2, 3, 4, 3, 2, 1, 0]
    assert (OVERLAP == OVERLAP.T).all()


@pytest.mark.parametrize("seed", range(3))
def test_a_strong_diagonal_passes_c1_and_a_shuffled_one_fails(seed: int) -> None:
    diagonal = rows(np.full((8, 8), 0.12) + 0.06 * np.eye(8) + noise(seed))
    result = criterion.self_dominance(diagonal)
    assert result["passed"] and result["p"] == 1 / math.factorial(8), result
    assert result["rows_self_max"] == 8 and result["rows_self_above_mean"] == 8
    shuffled = diagonal[:, np.random.default_rng(seed).permutation(8)]
    while np.any(np.argmax(shuffled, axis=1) == np.arange(8)):  # no self weight left on the diagonal's peak
        shuffled = shuffled[:, np.roll(np.arange(8), 1)]
    failed = criterion.self_dominance(shuffled)
    assert not failed["passed"] and failed["rows_self_max"] == 0, failed


def test_uniform_rows_fail_c1_because_ties_count_against_the_claim() -> None:
    result = criterion.self_dominance(np.full((8, 8), 1 / 8))
    assert result["p"] == 1.0 and not result["passed"]


@pytest.mark.parametrize("seed", range(3))
def test_the_overlap_plus_noise_passes_c2_and_relabelled_clients_fail(seed: int) -> None:
    structured = rows(0.1 + 0.01 * OVERLAP + noise(seed, 0.002))
    result = criterion.overlap_structure(structured, OVERLAP)
    assert result["passed"] and result["rho"] > 0.8 and result["D"] > 0 and result["p"] < 0.001, result
    relabel = np.array([0, 4, 1, 5, 2, 6, 3, 7])  # neighbours become non-neighbours
    relabelled = structured[np.ix_(relabel, relabel)]
    failed = criterion.overlap_structure(relabelled, OVERLAP)
    assert not failed["passed"] and failed["p"] > 0.01, failed


def test_c2_is_not_passed_by_a_diagonal_alone() -> None:
    diagonal = rows(np.full((8, 8), 0.12) + 0.06 * np.eye(8) + noise(5, 0.001))
    assert not criterion.overlap_structure(diagonal, OVERLAP)["passed"]


def test_one_hot_rows_fail_c3_and_soft_rows_pass() -> None:
    layers = np.stack([rows(np.full((8, 8), 0.12) + noise(i)) for i in range(3)], axis=1)  # (8, 3, 8)
    assert criterion.no_collapse(layers)["passed"]
    collapsed = layers.copy()
    collapsed[2, 1] = np.eye(8)[2]  # one layer of one client collapsed
    result = criterion.no_collapse(collapsed)
    assert not result["passed"] and result["one_hot_layer_rows"] == 1 and result["one_hot_mean_rows"] == 0
    everywhere = layers.copy()
    everywhere[:, :] = np.eye(8)[:, None, :]
    assert criterion.no_collapse(everywhere)["one_hot_mean_rows"] == 8


def test_judge_needs_all_three() -> None:
    good = rows(0.1 + 0.01 * OVERLAP + 0.03 * np.eye(8) + noise(0, 0.002))
    layers = np.stack([good, good, good], axis=1)
    verdict = criterion.judge(layers, OVERLAP)
    assert verdict["passed"] and verdict["strict_rows"] == 8, verdict
    layers[0, 0] = np.eye(8)[0]
    assert not criterion.judge(layers, OVERLAP)["passed"]


def test_the_evaluation_point_is_the_first_round_at_one_and_a_half_over_n() -> None:
    assert criterion.evaluation_point([0.125, 0.15, 0.1875, 0.2, 0.19], 8) == (2, True)
    assert criterion.evaluation_point([0.125, 0.15, 0.18], 8) == (2, False)


def test_spearman_with_ties_matches_the_textbook_values() -> None:
    assert criterion.spearman(np.array([1.0, 2, 3, 4]), np.array([10.0, 20, 30, 40])) == pytest.approx(1.0)
    assert criterion.spearman(np.array([1.0, 2, 3, 4]), np.array([4.0, 3, 2, 1])) == pytest.approx(-1.0)
    # ranks of y with a tie: [1, 2.5, 2.5, 4]; Pearson of [1, 2, 3, 4] with them = 0.9486832980505138
    assert criterion.spearman(np.array([1.0, 2, 3, 4]), np.array([1.0, 5, 5, 9])) == pytest.approx(0.9486832980505138)


def test_the_eta_rule_and_the_centred_norm() -> None:
    gradient = np.array([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]])
    np.testing.assert_allclose(criterion.centred_norms(gradient), [math.sqrt(2.0), 0.0])
    assert criterion.eta_rule(gbar=2.0, gamma=0.03, rounds=200) == pytest.approx(0.1 / (0.03 * 200 * 2.0))
    with pytest.raises(ValueError, match="gbar > 0"):
        criterion.eta_rule(gbar=0.0, gamma=0.03, rounds=200)
