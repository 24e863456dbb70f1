"""Each client's test split comes from the official test set, sized by its data and shaped by its labels."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.fldata import Dataset, load_dataset, partition
from fedge.fldata.partition import MIN_TEST_SIZE, apportion


@pytest.fixture(scope="module")
def demo() -> Dataset:
    return load_dataset("fmnist-demo")


@pytest.mark.parametrize(("scheme", "options"), [("dirichlet", {"alpha": 0.5}), ("classes", {}), ("dominant", {}),
                                                 ("iid", {})])
def test_split_follows_training_label_proportions(demo: Dataset, scheme: str, options: dict[str, object]) -> None:
    shards = partition(demo, scheme, 10, seed=6, **options)  # type: ignore[arg-type]
    raw_test = {img.tobytes(): int(y) for img, y in zip(demo.test_x, demo.test_y, strict=True)}
    for s in shards:
        n = len(s.train_y)
        size = max(MIN_TEST_SIZE, round(len(demo.test_y) * n / len(demo.train_y)))
        assert len(s.test_y) == size
        train_p = np.array(s.label_counts()) / n
        test_counts = np.bincount(s.test_y, minlength=10)
        assert np.all(np.abs(test_counts - size * train_p) < 1.0 + 1e-9)
        for img, y in zip(s.test_x, s.test_y, strict=True):  # every image is an official test image
            assert raw_test[img.tobytes()] == y


def numbered_test_set(n_test: int) -> Dataset:
    """Test images whose first two pixels spell their own index."""
    rng = np.random.default_rng(0)
    test_x = np.zeros((n_test, 1, 2, 2), np.uint8)
    test_x[:, 0, 0, 0], test_x[:, 0, 0, 1] = np.arange(n_test) & 255, np.arange(n_test) >> 8
    return Dataset(name="numbered", train_x=rng.integers(0, 256, (2000, 1, 2, 2), dtype=np.uint8),
                   train_y=np.arange(2000) % 10, test_x=test_x, test_y=np.arange(n_test) % 10, num_classes=10,
                   mean=(0.5,), std=(0.25,))


@pytest.mark.parametrize("n_test", [1000, 60])
def test_no_repeats_while_the_class_has_enough(n_test: int) -> None:
    ds = numbered_test_set(n_test)
    for s in partition(ds, "dirichlet", 4, seed=2, alpha=0.2):
        ids = s.test_x[:, 0, 0, 0].astype(np.int64) + 256 * s.test_x[:, 0, 0, 1].astype(np.int64)
        np.testing.assert_array_equal(ds.test_y[ids], s.test_y)
        for c in range(10):
            wanted, available = int((s.test_y == c).sum()), n_test // 10
            assert len(np.unique(ids[s.test_y == c])) == min(wanted, available)


def test_small_clients_still_get_the_minimum(demo: Dataset) -> None:
    shards = partition(demo, "iid", 200, seed=0)
    assert all(len(s.train_y) == 60 and len(s.test_y) == MIN_TEST_SIZE for s in shards)


def test_global_test_set_is_untouched(demo: Dataset) -> None:
    before = demo.test_x.copy(), demo.test_y.copy()
    partition(demo, "feature-shift", 5, seed=0)
    np.testing.assert_array_equal(demo.test_x, before[0])
    np.testing.assert_array_equal(demo.test_y, before[1])


def test_apportion_is_exact_and_proportional() -> None:
    counts = apportion(101, np.array([1.0, 1.0, 1.0, 0.0, 7.0]))
    assert counts.sum() == 101 and counts[3] == 0
    assert np.all(np.abs(counts - 101 * np.array([1, 1, 1, 0, 7]) / 10) < 1)
