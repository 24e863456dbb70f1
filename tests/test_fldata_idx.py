"""Fashion-MNIST IDX files, plain and gzip, read back exactly; broken or missing files name themselves."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from fedge.fldata import DataError, load_dataset

IMAGES, LABELS = 0x00000803, 0x00000801
STEMS = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    return struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write_fmnist(directory: Path, gz: bool, n_train: int = 30, n_test: int = 12) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    arrays = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_y": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_x": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_y": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for part, stem in STEMS.items():
        data = idx_bytes(arrays[part], IMAGES if part.endswith("_x") else LABELS)
        if gz:
            (directory / (stem + ".gz")).write_bytes(gzip.compress(data))
        else:
            (directory / stem).write_bytes(data)
    return arrays


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "raw"])
def test_round_trip(tmp_path: Path, gz: bool) -> None:
    arrays = write_fmnist(tmp_path, gz)
    ds = load_dataset("fmnist", str(tmp_path))
    assert ds.name == "fmnist" and ds.num_classes == 10 and ds.input_shape == (1, 28, 28)
    assert ds.train_x.dtype == np.uint8 and ds.train_y.dtype == np.int64
    np.testing.assert_array_equal(ds.train_x[:, 0], arrays["train_x"])
    np.testing.assert_array_equal(ds.train_y, arrays["train_y"])
    np.testing.assert_array_equal(ds.test_x[:, 0], arrays["test_x"])
    np.testing.assert_array_equal(ds.test_y, arrays["test_y"])
    pixels = arrays["train_x"].astype(np.float64) / 255
    assert ds.mean[0] == pytest.approx(pixels.mean(), abs=1e-12)
    assert ds.std[0] == pytest.approx(pixels.std(), abs=1e-12)


def test_directory_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_fmnist(tmp_path, gz=True)
    monkeypatch.setenv("FEDGE_FMNIST_DIR", str(tmp_path))
    assert len(load_dataset("fmnist").train_y) == 30


def test_missing_file_is_named(tmp_path: Path) -> None:
    write_fmnist(tmp_path, gz=False)
    (tmp_path / STEMS["test_y"]).unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte"):
        load_dataset("fmnist", str(tmp_path))


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nowhere"):
        load_dataset("fmnist", str(tmp_path / "nowhere"))


def test_wrong_magic_is_named(tmp_path: Path) -> None:
    arrays = write_fmnist(tmp_path, gz=False)
    (tmp_path / STEMS["train_x"]).write_bytes(idx_bytes(arrays["train_x"].reshape(30, -1), 0x00000802))
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte.*magic"):
        load_dataset("fmnist", str(tmp_path))


@pytest.mark.parametrize("cut", [2, 10, 100])
def test_truncated_file_is_named(tmp_path: Path, cut: int) -> None:
    write_fmnist(tmp_path, gz=False)
    path = tmp_path / STEMS["train_x"]
    path.write_bytes(path.read_bytes()[:-cut] if cut == 100 else path.read_bytes()[:cut])
    with pytest.raises(DataError, match="train-images-idx3-ubyte"):
        load_dataset("fmnist", str(tmp_path))


def test_corrupt_gzip_is_named(tmp_path: Path) -> None:
    write_fmnist(tmp_path, gz=True)
    path = tmp_path / (STEMS["train_y"] + ".gz")
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\.gz"):
        load_dataset("fmnist", str(tmp_path))


def test_image_and_label_counts_must_agree(tmp_path: Path) -> None:
    write_fmnist(tmp_path, gz=False)
    (tmp_path / STEMS["test_y"]).write_bytes(idx_bytes(np.zeros(11, np.uint8), LABELS))
    with pytest.raises(DataError, match="12 images but .* 11 labels"):
        load_dataset("fmnist", str(tmp_path))
