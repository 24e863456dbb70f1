"""The dominant partition gives each client every class, with its dominant ones holding about 80 percent."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.fldata import DataError, load_dataset, partition


@pytest.mark.parametrize(("clients", "dominant"), [(10, 2), (5, 2), (20, 3)])
def test_dominant_classes_hold_most_data(clients: int, dominant: int) -> None:
    shards = partition(load_dataset("fmnist-demo"), "dominant", clients, seed=2, dominant_classes=dominant)
    for s in shards:
        counts = np.array(s.label_counts())
        assert np.all(counts > 0)
        top = np.sort(np.argsort(-counts, kind="stable")[:dominant]).tolist()
        assert top == s.meta["dominant_classes"]
        share = counts[top].sum() / counts.sum()
        assert share == pytest.approx(0.8, abs=0.04)
        assert s.meta["dominant_share"] == pytest.approx(share, abs=1e-6)
    sizes = [len(s.train_y) for s in shards]
    assert max(sizes) / min(sizes) < 1.1


def test_dominant_count_must_leave_other_classes() -> None:
    with pytest.raises(DataError, match="dominant_classes must be in 1..9"):
        partition(load_dataset("fmnist-demo"), "dominant", 10, seed=0, dominant_classes=10)
