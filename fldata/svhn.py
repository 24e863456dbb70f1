"""SVHN (cropped digits, format 2) from the official `train_32x32.mat` and `test_32x32.mat`.

Each file is a MATLAB v5 file with `X`, uint8 shaped 32 x 32 x 3 x N, and `y`, shaped N x 1, where label 10
stands for the digit 0. Reading .mat files needs scipy, imported only when SVHN is loaded (the optional
extra `pip install fedge[svhn]`). `extra_32x32.mat` is not used. This module must not know about
partitioning, other datasets or any other Fedge package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fedge.fldata.dataset import DataError, Dataset, channel_stats

SVHN_ENV = "FEDGE_SVHN_DIR"
SVHN_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat"}
SVHN_CLASSES = 10


def _loadmat(path: Path) -> dict[str, Any]:
    try:
        import scipy.io
    except ImportError:
        raise DataError(
            f"{path}: reading SVHN .mat files needs scipy; install it with: pip install fedge[svhn]"
        ) from None
    try:
        return dict(scipy.io.loadmat(str(path), variable_names=("X", "y")))
    except (OSError, ValueError, TypeError, NotImplementedError, EOFError) as exc:
        raise DataError(f"{path}: not a readable MATLAB v5 .mat file: {exc}") from None


def read_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (N x 3 x 32 x 32 uint8) and labels (N int64, 10 mapped to 0) of one SVHN .mat file."""
    if not path.is_file():
        raise DataError(f"{path}: missing SVHN file")
    content = _loadmat(path)
    if "X" not in content or "y" not in content:
        raise DataError(f"{path}: expected variables X and y, found {sorted(k for k in content if k[0] != '_')}")
    x, y = np.asarray(content["X"]), np.asarray(content["y"])
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise DataError(f"{path}: X must be uint8 shaped 32 x 32 x 3 x N, found {x.dtype} {x.shape}")
    if y.ndim not in (1, 2) or y.size != x.shape[3] or (y.ndim == 2 and 1 not in y.shape):
        raise DataError(f"{path}: y must hold one label per image ({x.shape[3]}), found shape {y.shape}")
    labels = y.reshape(-1)
    if not np.issubdtype(labels.dtype, np.number) or not np.all(np.isin(labels, np.arange(11))):
        raise DataError(f"{path}: labels must be integers 1..10 (10 meaning digit 0)")
    labels = labels.astype(np.int64)
    labels[labels == 10] = 0
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), labels


def svhn_dir(path: str | None) -> Path:
    """The directory holding the .mat files: path, else $FEDGE_SVHN_DIR."""
    given = path or os.environ.get(SVHN_ENV)
    if not given:
        raise DataError(f"svhn needs a data directory: pass the folder holding {SVHN_FILES['train']} "
                        f"and {SVHN_FILES['test']} (or set ${SVHN_ENV})")
    directory = Path(given)
    if not directory.is_dir():
        raise DataError(f"{directory}: SVHN directory not found")
    return directory


def load_svhn(path: str | None = None) -> Dataset:
    """SVHN (73,257 train / 26,032 test) from the official .mat files."""
    directory = svhn_dir(path)
    train_x, train_y = read_mat(directory / SVHN_FILES["train"])
    test_x, test_y = read_mat(directory / SVHN_FILES["test"])
    mean, std = channel_stats(train_x)
    return Dataset(
        name="svhn",
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=SVHN_CLASSES,
        mean=mean,
        std=std,
    )
