"""CIFAR-10 from the official "python version" batches, read with a restricted unpickler.

The archive `cifar-10-python.tar.gz` unpacks to `cifar-10-batches-py/` holding `data_batch_1` ..
`data_batch_5` and `test_batch`. Each is a pickled dict with bytes keys: b"data" (a uint8 numpy array of
10000 x 3072 holding the red, green and blue 32 x 32 planes of each image), b"labels" (a list of ints in
0..9), b"batch_label" and b"filenames".

Unpickling can run arbitrary code, so `RestrictedUnpickler` resolves only the globals those files need:
numpy's array reconstructor, `numpy.ndarray` and `numpy.dtype` (under both numpy 1 and numpy 2 module
names), plus `_codecs.encode` limited to latin-1 and `bytes`, which Python 3 writes for bytes objects in
protocol 2 pickles. Anything else, `os.system` included, is refused before it is looked up. This module
must not know about partitioning, other datasets or any other Fedge package.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedge.fldata.dataset import DataError, Dataset, channel_stats

CIFAR_ENV = "FEDGE_CIFAR10_DIR"
CIFAR_SUBDIR = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
CIFAR_CLASSES = 10
_ROW = 3 * 32 * 32
_real_reconstruct: Callable[..., Any] = np.empty(0).__reduce__()[0]  # type: ignore[assignment]


def _reconstruct(subtype: object, shape: object, dtype_code: object) -> Any:
    if subtype is not np.ndarray:
        raise pickle.UnpicklingError(f"array reconstruction of {subtype!r} is not allowed")
    return _real_reconstruct(subtype, shape, dtype_code)


def _dtype(spec: object, align: object = False, copy: object = False) -> np.dtype:
    if not isinstance(spec, (str, bytes)):
        raise pickle.UnpicklingError(f"dtype spec {spec!r} is not allowed")
    text = spec.decode("ascii") if isinstance(spec, bytes) else spec
    dt = np.dtype(text, align=bool(align), copy=True)  # never hand out numpy's shared instances
    if dt.hasobject:
        raise pickle.UnpicklingError("object dtypes are not allowed")
    return dt


def _latin1_encode(text: object, encoding: object = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("only _codecs.encode(str, 'latin1') is allowed")
    return text.encode("latin-1")


_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
    ("_codecs", "encode"): _latin1_encode,
    ("__builtin__", "bytes"): bytes,
    ("builtins", "bytes"): bytes,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals a CIFAR batch needs; any other raises UnpicklingError."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in a dataset file") from None


def restricted_loads(data: bytes) -> Any:
    """Unpickle data with `RestrictedUnpickler`; Python 2 strings come back as bytes, as in the real files."""
    return RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (N x 3 x 32 x 32 uint8) and labels (N int64) of one CIFAR-10 batch file."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read CIFAR-10 batch: {exc}") from None
    try:
        batch = restricted_loads(raw)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise DataError(f"{path}: not a valid CIFAR-10 batch: {exc}") from None
    if not isinstance(batch, dict):
        raise DataError(f"{path}: expected a pickled dict, found {type(batch).__name__}")
    data = _field(batch, "data", path)
    labels = _field(batch, "labels", path)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _ROW:
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{path}: b'data' must be a uint8 array N x {_ROW}, found {got}")
    if not isinstance(labels, list) or not all(type(v) is int for v in labels):
        raise DataError(f"{path}: b'labels' must be a list of ints")
    y = np.asarray(labels, dtype=np.int64)
    if len(y) != len(data):
        raise DataError(f"{path}: {len(data)} images but {len(y)} labels")
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= CIFAR_CLASSES):
        raise DataError(f"{path}: labels must lie in 0..9, found {int(y.min())}..{int(y.max())}")
    return np.ascontiguousarray(data.reshape(-1, 3, 32, 32)), y


def _field(batch: dict[Any, Any], key: str, path: Path) -> Any:
    for k in (key.encode("ascii"), key):
        if k in batch:
            return batch[k]
    raise DataError(f"{path}: the pickled dict has no b'{key}' entry")


def cifar_dir(path: str | None) -> Path:
    """The directory holding the batches: path (or $FEDGE_CIFAR10_DIR), or its cifar-10-batches-py/."""
    given = path or os.environ.get(CIFAR_ENV)
    if not given:
        raise DataError(
            f"cifar10 needs a data directory: pass the folder holding {CIFAR_SUBDIR}/ (or set ${CIFAR_ENV})"
        )
    directory = Path(given)
    if (directory / CIFAR_SUBDIR).is_dir():
        directory = directory / CIFAR_SUBDIR
    if not directory.is_dir():
        raise DataError(f"{directory}: CIFAR-10 directory not found")
    return directory


def load_cifar10(path: str | None = None) -> Dataset:
    """CIFAR-10 (50,000 train / 10,000 test) from the official python batches."""
    directory = cifar_dir(path)
    for name in (*TRAIN_BATCHES, TEST_BATCH):
        if not (directory / name).is_file():
            raise DataError(f"{directory / name}: missing CIFAR-10 batch file")
    train = [read_batch(directory / name) for name in TRAIN_BATCHES]
    test_x, test_y = read_batch(directory / TEST_BATCH)
    train_x = np.concatenate([x for x, _ in train])
    mean, std = channel_stats(train_x)
    return Dataset(
        name="cifar10",
        train_x=train_x,
        train_y=np.concatenate([y for _, y in train]),
        test_x=test_x,
        test_y=test_y,
        num_classes=CIFAR_CLASSES,
        mean=mean,
        std=std,
    )
