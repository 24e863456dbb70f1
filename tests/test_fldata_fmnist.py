"""The full Fashion-MNIST loads from the Debian location, and the demo is a true subset of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedge.fldata import load_dataset
from fedge.fldata.idx import DEFAULT_FMNIST_DIR
from fedge.fldata.loaders import DEMO_PATH

pytestmark = pytest.mark.skipif(
    not DEFAULT_FMNIST_DIR.is_dir(), reason=f"{DEFAULT_FMNIST_DIR} is absent (Debian package dataset-fashion-mnist)"
)


def test_full_set_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDGE_FMNIST_DIR", raising=False)
    ds = load_dataset("fmnist")
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.test_x.shape == (10000, 1, 28, 28)
    assert np.bincount(ds.train_y).tolist() == [6000] * 10
    assert np.bincount(ds.test_y).tolist() == [1000] * 10
    assert ds.mean[0] == pytest.approx(0.2860, abs=1e-4) and ds.std[0] == pytest.approx(0.3530, abs=1e-4)
    with np.load(Path(DEMO_PATH), allow_pickle=False) as demo:
        np.testing.assert_array_equal(ds.train_x[demo["train_source_index"]], demo["train_x"])
        np.testing.assert_array_equal(ds.test_y[demo["test_source_index"]], demo["test_y"])
