"""SVHN .mat files load exactly, with label 10 read as digit 0; broken files name themselves."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fedge.fldata import DataError, load_dataset

scipy_io = pytest.importorskip("scipy.io", reason="SVHN needs scipy (pip install fedge[svhn])")


def write_svhn(directory: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    content = {}
    for split, n in (("train", 9), ("test", 5)):
        x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
        y = rng.integers(1, 11, (n, 1)).astype(np.uint8)
        y[0, 0] = 10
        scipy_io.savemat(str(directory / f"{split}_32x32.mat"), {"X": x, "y": y})
        content[split] = (x, y)
    return content


def test_round_trip(tmp_path: Path) -> None:
    content = write_svhn(tmp_path)
    ds = load_dataset("svhn", str(tmp_path))
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 10
    for split, (x_ds, y_ds) in {"train": (ds.train_x, ds.train_y), "test": (ds.test_x, ds.test_y)}.items():
        x, y = content[split]
        assert len(x_ds) == x.shape[3]
        for i in range(x.shape[3]):
            np.testing.assert_array_equal(x_ds[i], x[:, :, :, i].transpose(2, 0, 1))
        expected = y[:, 0].astype(np.int64)
        expected[expected == 10] = 0
        np.testing.assert_array_equal(y_ds, expected)
        assert y_ds[0] == 0


def test_missing_file_is_named(tmp_path: Path) -> None:
    write_svhn(tmp_path)
    (tmp_path / "test_32x32.mat").unlink()
    with pytest.raises(DataError, match="test_32x32.mat"):
        load_dataset("svhn", str(tmp_path))


def test_missing_variable_is_named(tmp_path: Path) -> None:
    write_svhn(tmp_path)
    scipy_io.savemat(str(tmp_path / "train_32x32.mat"), {"X": np.zeros((32, 32, 3, 2), np.uint8)})
    with pytest.raises(DataError, match=r"train_32x32.mat.*X and y"):
        load_dataset("svhn", str(tmp_path))


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (np.zeros((28, 28, 3, 2), np.uint8), np.ones((2, 1)), "32 x 32 x 3 x N"),
        (np.zeros((32, 32, 3, 2), np.uint8), np.ones((3, 1)), "one label per image"),
        (np.zeros((32, 32, 3, 2), np.uint8), np.array([[1], [11]]), "1..10"),
    ],
)
def test_malformed_content_is_named(tmp_path: Path, x: np.ndarray, y: np.ndarray, message: str) -> None:
    write_svhn(tmp_path)
    scipy_io.savemat(str(tmp_path / "train_32x32.mat"), {"X": x, "y": y})
    with pytest.raises(DataError, match=message) as info:
        load_dataset("svhn", str(tmp_path))
    assert "train_32x32.mat" in str(info.value)


def test_not_a_mat_file_is_named(tmp_path: Path) -> None:
    write_svhn(tmp_path)
    (tmp_path / "train_32x32.mat").write_bytes(b"this is not a MATLAB file at all" * 10)
    with pytest.raises(DataError, match="train_32x32.mat"):
        load_dataset("svhn", str(tmp_path))


def test_without_scipy_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_svhn(tmp_path)
    monkeypatch.setitem(sys.modules, "scipy.io", None)
    with pytest.raises(DataError, match=r"pip install fedge\[svhn\]"):
        load_dataset("svhn", str(tmp_path))
