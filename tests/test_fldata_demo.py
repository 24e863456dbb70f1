"""The bundled fmnist-demo set: 12,000 / 2,000 real images, class balanced, fast, and as its README says."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import numpy as np

from fedge import fldata
from fedge.fldata import load_dataset

DEMO_DIR = Path(fldata.__file__).parent / "demo"


def test_demo_loads_balanced_and_fast() -> None:
    start = time.perf_counter()
    ds = load_dataset("fmnist-demo")
    assert time.perf_counter() - start < 1.0
    assert ds.name == "fmnist-demo" and ds.num_classes == 10 and ds.input_shape == (1, 28, 28)
    assert ds.train_x.shape == (12000, 1, 28, 28) and ds.test_x.shape == (2000, 1, 28, 28)
    assert ds.train_x.dtype == np.uint8 and ds.train_y.dtype == np.int64
    assert np.bincount(ds.train_y).tolist() == [1200] * 10
    assert np.bincount(ds.test_y).tolist() == [200] * 10
    # Fashion-MNIST's well-known statistics, 0.2860 / 0.3530 over the full training set.
    assert abs(ds.mean[0] - 0.2860) < 0.003 and abs(ds.std[0] - 0.3530) < 0.003


def test_demo_is_small_and_matches_its_readme() -> None:
    npz = DEMO_DIR / "fmnist-demo.npz"
    assert npz.stat().st_size < 8_000_000
    readme = (DEMO_DIR / "README.md").read_text(encoding="utf-8")
    assert "MIT" in readme and "Zalando SE" in readme and "python -m fedge.fldata.build_demo" in readme
    listed = dict(re.findall(r"\| `(\w+)` \| \w+ \| [\d x]+ \| `([0-9a-f]{64})` \|", readme))
    with np.load(npz, allow_pickle=False) as arrays:
        assert sorted(listed) == sorted(arrays.files)
        for name in arrays.files:
            assert hashlib.sha256(np.ascontiguousarray(arrays[name]).tobytes()).hexdigest() == listed[name]
