"""The classes partition gives each client exactly k classes, shared equally; the chain layout overlaps by k-1."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.fldata import DataError, Dataset, load_dataset, partition


@pytest.fixture(scope="module")
def demo() -> Dataset:
    return load_dataset("fmnist-demo")


@pytest.mark.parametrize(("clients", "k"), [(10, 4), (7, 2), (20, 3), (3, 4), (10, 10)])
def test_exactly_k_classes_per_client(demo: Dataset, clients: int, k: int) -> None:
    shards = partition(demo, "classes", clients, seed=5, classes_per_client=k)
    holders = np.zeros(10, dtype=np.int64)
    for s in shards:
        held = np.flatnonzero(s.label_counts())
        assert len(held) == k
        assert held.tolist() == s.meta["classes"]
        holders[held] += 1
    assert holders.max() - holders.min() <= 1  # the class sets are balanced
    for c in range(10):  # each class is shared equally among its holders
        counts = [s.label_counts()[c] for s in shards if s.label_counts()[c]]
        assert max(counts) - min(counts) <= 1 and sum(counts) == 1200


def test_chain_neighbours_share_three_classes(demo: Dataset) -> None:
    shards = partition(demo, "classes", 10, seed=0, classes_layout="chain")
    sets = [set(np.flatnonzero(s.label_counts()).tolist()) for s in shards]
    for i in range(10):
        assert sets[i] == {i % 10, (i + 1) % 10, (i + 2) % 10, (i + 3) % 10}
        assert len(sets[i] & sets[(i + 1) % 10]) == 3
    assert all(len(s.train_y) == 1200 for s in shards)


def test_chain_is_the_same_for_every_seed(demo: Dataset) -> None:
    a = partition(demo, "classes", 12, seed=0, classes_layout="chain", classes_per_client=3)
    b = partition(demo, "classes", 12, seed=8, classes_layout="chain", classes_per_client=3)
    assert [s.meta["classes"] for s in a] == [s.meta["classes"] for s in b]


@pytest.mark.parametrize(
    ("clients", "options", "message"),
    [
        (2, {"classes_per_client": 4}, "cannot cover 10 classes"),
        (5, {"classes_layout": "chain"}, "chain of 5 clients"),
        (10, {"classes_per_client": 11}, "must be in 1..10"),
    ],
)
def test_uncoverable_layouts_are_refused(demo: Dataset, clients: int, options: dict[str, object], message: str) -> None:
    with pytest.raises(DataError, match=message):
        partition(demo, "classes", clients, seed=0, **options)  # type: ignore[arg-type]
