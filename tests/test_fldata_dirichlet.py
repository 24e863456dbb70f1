"""Dirichlet label skew grows as alpha falls, and an impossible minimum fails after bounded retries."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.fldata import ClientShard, DataError, Dataset, load_dataset, partition
from fedge.fldata.schemes import DIRICHLET_ATTEMPTS


@pytest.fixture(scope="module")
def demo() -> Dataset:
    return load_dataset("fmnist-demo")


def mean_label_entropy(shards: list[ClientShard]) -> float:
    entropies = []
    for s in shards:
        p = np.array(s.label_counts(), dtype=np.float64)
        p = p[p > 0] / p.sum()
        entropies.append(float(-(p * np.log(p)).sum()))
    return float(np.mean(entropies))


def test_skew_grows_as_alpha_falls(demo: Dataset) -> None:
    for seed in (0, 1, 2):
        h = [mean_label_entropy(partition(demo, "dirichlet", 10, seed=seed, alpha=a)) for a in (0.1, 1.0, 100.0)]
        assert h[0] < h[1] < h[2], h
        assert h[2] > 0.98 * np.log(10)


def test_minimum_size_holds_under_strong_skew(demo: Dataset) -> None:
    shards = partition(demo, "dirichlet", 20, seed=1, alpha=0.05, min_size=20)
    assert min(len(s.train_y) for s in shards) >= 20
    assert shards[0].meta["alpha"] == 0.05 and shards[0].meta["attempts"] > 1  # it did resample
    assert sum(len(s.train_y) for s in shards) == len(demo.train_y)


def test_impossible_minimum_fails_after_bounded_retries(demo: Dataset) -> None:
    with pytest.raises(DataError, match=f"no draw in {DIRICHLET_ATTEMPTS} attempts"):
        partition(demo, "dirichlet", 100, seed=0, alpha=0.01, min_size=100)
